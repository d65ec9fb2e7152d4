#!/bin/bash
# Oracle of rl360/write-word-medium-09.
cd /app
printf stone > fruit.txt
