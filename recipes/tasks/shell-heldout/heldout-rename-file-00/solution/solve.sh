#!/bin/bash
# Oracle of rl360/heldout-rename-file-00.
cd /app
mv story.txt card.txt
