#!/bin/bash
# Oracle of rl360/heldout-two-words-00.
cd /app
echo 'copper harbor' > report.txt
