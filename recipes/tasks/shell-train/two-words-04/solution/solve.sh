#!/bin/bash
# Oracle of rl360/two-words-04.
cd /app
echo 'maple button' > record.txt
