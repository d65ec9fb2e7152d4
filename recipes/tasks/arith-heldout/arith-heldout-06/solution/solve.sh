#!/bin/bash
# Oracle of rl360/arith-heldout-06: writes the canonical answer.
cd /app
echo '(x*2)//5' > answer.py
