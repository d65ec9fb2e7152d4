#!/bin/bash
# Oracle of rl360/python-print-07.
cd /app
echo 'print("island")' > record.py
