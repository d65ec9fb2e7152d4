#!/bin/bash
# Oracle of rl360/python-print-08.
cd /app
echo 'print("maple")' > color.py
