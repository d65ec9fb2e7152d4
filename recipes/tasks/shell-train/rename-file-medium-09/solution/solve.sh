#!/bin/bash
# Oracle of rl360/rename-file-medium-09.
cd /app
mv entry.txt result/
