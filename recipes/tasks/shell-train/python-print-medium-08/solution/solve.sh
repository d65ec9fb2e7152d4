#!/bin/bash
# Oracle of rl360/python-print-medium-08.
cd /app
echo 'print(35 + 36)' > record.py
