#!/bin/bash
# Oracle of rl360/python-fix-07.
cd /app
sed -i 's/stone/hammer/' entry.py
