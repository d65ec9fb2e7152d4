#!/bin/bash
# Oracle of rl360/python-fix-01.
cd /app
sed -i 's/rocket/button/' city.py
