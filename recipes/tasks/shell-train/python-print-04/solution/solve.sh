#!/bin/bash
# Oracle of rl360/python-print-04.
cd /app
echo 'print("jacket")' > data.py
