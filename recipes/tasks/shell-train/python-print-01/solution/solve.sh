#!/bin/bash
# Oracle of rl360/python-print-01.
cd /app
echo 'print("anchor")' > info.py
