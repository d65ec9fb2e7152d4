#!/bin/bash
# Oracle of rl360/copy-file-hard-08.
cd /app
mkdir out && cp memo.txt out/
