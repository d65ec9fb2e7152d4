#!/bin/bash
# Oracle of rl360/arith-heldout-03: writes the canonical answer.
cd /app
echo '(x*9)+3' > answer.py
