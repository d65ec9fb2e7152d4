#!/bin/bash
# Oracle of rl360/python-fix-00.
cd /app
sed -i 's/river/anchor/' todo.py
