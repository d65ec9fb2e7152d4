#!/bin/bash
# Oracle of rl360/write-word-01.
cd /app
echo apple > result.txt
