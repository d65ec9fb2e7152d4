#!/bin/bash
# Oracle of rl360/copy-file-04.
cd /app
cp list.txt memo.txt
