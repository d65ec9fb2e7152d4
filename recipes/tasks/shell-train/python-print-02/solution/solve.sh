#!/bin/bash
# Oracle of rl360/python-print-02.
cd /app
echo 'print("jacket")' > entry.py
