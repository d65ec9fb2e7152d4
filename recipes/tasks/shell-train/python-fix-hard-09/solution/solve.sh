#!/bin/bash
# Oracle of rl360/python-fix-hard-09.
cd /app
sed -i 's/garden/pepper/' log.py && python3 log.py > list.txt
