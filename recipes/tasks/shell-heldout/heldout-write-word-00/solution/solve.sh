#!/bin/bash
# Oracle of rl360/heldout-write-word-00.
cd /app
echo planet > answer.txt
