#!/bin/bash
# Oracle of rl360/python-fix-02.
cd /app
sed -i 's/hammer/lemon/' word.py
