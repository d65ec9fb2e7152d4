#!/bin/bash
# Oracle of rl360/arith-heldout-13: writes the canonical answer.
cd /app
echo '((x*-1)%6)-4' > answer.py
