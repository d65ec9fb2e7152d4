#!/bin/bash
# Oracle of rl360/python-fix-03.
cd /app
sed -i 's/tiger/orange/' notes.py
