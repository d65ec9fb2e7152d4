#!/bin/bash
# Oracle of rl360/python-print-00.
cd /app
echo 'print("stone")' > animal.py
