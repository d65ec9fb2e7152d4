#!/bin/bash
# Oracle of rl360/write-word-medium-08.
cd /app
printf hammer > record.txt
