#!/bin/bash
# Oracle of rl360/rename-file-04.
cd /app
mv memo.txt out.txt
