#!/bin/bash
# Oracle of rl360/two-words-01.
cd /app
echo 'button stone' > log.txt
