#!/bin/bash
# Oracle of rl360/arith-heldout-05: writes the canonical answer.
cd /app
echo '(x//4)*3' > answer.py
