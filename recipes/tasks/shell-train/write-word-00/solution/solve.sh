#!/bin/bash
# Oracle of rl360/write-word-00.
cd /app
echo hammer > word.txt
