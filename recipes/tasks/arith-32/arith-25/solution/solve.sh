#!/bin/bash
# Oracle of rl360/arith-25: writes the canonical answer.
cd /app
echo '(x*2)*-1' > answer.py
