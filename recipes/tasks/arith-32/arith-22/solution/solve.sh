#!/bin/bash
# Oracle of rl360/arith-22: writes the canonical answer.
cd /app
echo '(x*-1)//5' > answer.py
