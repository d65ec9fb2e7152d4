#!/bin/bash
# Oracle of rl360/heldout-python-print-01.
cd /app
echo 'print("walnut")' > answer.py
