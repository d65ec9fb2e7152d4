#!/bin/bash
# Oracle of rl360/arith-heldout-11: writes the canonical answer.
cd /app
echo '((x+4)*-1)//6' > answer.py
