#!/bin/bash
# Oracle of rl360/arith-heldout-09: writes the canonical answer.
cd /app
echo '(x//9)+8' > answer.py
