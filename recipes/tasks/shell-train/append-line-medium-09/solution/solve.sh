#!/bin/bash
# Oracle of rl360/append-line-medium-09.
cd /app
cat todo.txt >> log.txt
