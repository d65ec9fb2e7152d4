#!/bin/bash
# Oracle of rl360/python-print-03.
cd /app
echo 'print("orange")' > animal.py
