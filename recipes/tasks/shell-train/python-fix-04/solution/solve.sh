#!/bin/bash
# Oracle of rl360/python-fix-04.
cd /app
sed -i 's/cloud/lemon/' todo.py
