#!/bin/bash
# Oracle of rl360/append-line-hard-09.
cd /app
echo cloud >> color.txt && echo anchor >> color.txt
