#!/bin/bash
# Oracle of rl360/arith-12: writes the canonical answer.
cd /app
echo '(x*5)*9' > answer.py
