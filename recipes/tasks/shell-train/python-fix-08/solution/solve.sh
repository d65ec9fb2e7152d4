#!/bin/bash
# Oracle of rl360/python-fix-08.
cd /app
sed -i 's/orange/pepper/' color.py
