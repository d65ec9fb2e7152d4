#!/bin/bash
# Oracle of rl360/copy-file-medium-09.
cd /app
cp todo.txt data/
