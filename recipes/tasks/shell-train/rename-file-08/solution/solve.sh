#!/bin/bash
# Oracle of rl360/rename-file-08.
cd /app
mv entry.txt result.txt
