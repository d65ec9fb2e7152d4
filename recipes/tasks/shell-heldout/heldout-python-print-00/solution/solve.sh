#!/bin/bash
# Oracle of rl360/heldout-python-print-00.
cd /app
echo 'print("walnut")' > story.py
