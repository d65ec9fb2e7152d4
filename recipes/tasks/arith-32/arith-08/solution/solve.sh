#!/bin/bash
# Oracle of rl360/arith-08: writes the canonical answer.
cd /app
echo 'x%8' > answer.py
