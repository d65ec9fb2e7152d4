#!/bin/bash
# Oracle of rl360/heldout-copy-file-01.
cd /app
cp story.txt summary.txt
