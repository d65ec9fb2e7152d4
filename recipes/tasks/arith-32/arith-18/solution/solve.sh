#!/bin/bash
# Oracle of rl360/arith-18: writes the canonical answer.
cd /app
echo '(x*-1)+6' > answer.py
