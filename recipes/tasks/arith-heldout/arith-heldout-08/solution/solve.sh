#!/bin/bash
# Oracle of rl360/arith-heldout-08: writes the canonical answer.
cd /app
echo '(x*9)-4' > answer.py
