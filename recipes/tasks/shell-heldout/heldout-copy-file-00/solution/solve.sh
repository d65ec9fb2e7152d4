#!/bin/bash
# Oracle of rl360/heldout-copy-file-00.
cd /app
cp letter.txt answer.txt
