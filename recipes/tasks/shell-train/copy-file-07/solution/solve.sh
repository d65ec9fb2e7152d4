#!/bin/bash
# Oracle of rl360/copy-file-07.
cd /app
cp todo.txt word.txt
