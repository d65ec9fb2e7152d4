#!/bin/bash
# Oracle of rl360/two-words-medium-08.
cd /app
echo 'tiger forest rocket' > animal.txt
