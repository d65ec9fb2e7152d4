#!/bin/bash
# Oracle of rl360/python-fix-medium-09.
cd /app
sed -i 's/prnt/print/' info.py
