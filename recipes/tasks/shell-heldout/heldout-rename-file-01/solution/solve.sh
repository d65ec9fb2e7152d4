#!/bin/bash
# Oracle of rl360/heldout-rename-file-01.
cd /app
mv page.txt message.txt
