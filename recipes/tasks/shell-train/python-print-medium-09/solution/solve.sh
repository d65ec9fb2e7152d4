#!/bin/bash
# Oracle of rl360/python-print-medium-09.
cd /app
echo 'print(23 + 23)' > info.py
