#!/bin/bash
# Oracle of rl360/python-print-hard-08.
cd /app
echo 'for i in range(3): print("pepper")' > notes.py
