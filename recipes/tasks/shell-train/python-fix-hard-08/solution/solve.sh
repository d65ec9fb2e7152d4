#!/bin/bash
# Oracle of rl360/python-fix-hard-08.
cd /app
sed -i 's/rocket/garden/' city.py && python3 city.py > word.txt
