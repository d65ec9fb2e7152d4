#!/bin/bash
# Oracle of rl360/two-words-08.
cd /app
echo 'tiger river' > todo.txt
