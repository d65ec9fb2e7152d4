#!/bin/bash
# Oracle of rl360/arith-heldout-10: writes the canonical answer.
cd /app
echo '(x//5)*5' > answer.py
