#!/bin/bash
# Oracle of rl360/python-print-hard-09.
cd /app
echo 'for i in range(5): print("tiger")' > city.py
