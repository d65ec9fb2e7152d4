#!/bin/bash
# Oracle of rl360/heldout-two-words-01.
cd /app
echo 'planet dragon' > title.txt
