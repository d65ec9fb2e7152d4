#!/bin/bash
# Oracle of rl360/python-fix-medium-08.
cd /app
sed -i 's/prnt/print/' items.py
