#!/bin/bash
# Oracle of rl360/rename-file-hard-09.
cd /app
mv todo.txt color.txt && mv notes.txt out.txt
