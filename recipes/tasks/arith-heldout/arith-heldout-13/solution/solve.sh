#!/bin/bash
# Oracle of rl360/arith-heldout-13: writes the canonical answer.
cd /app
echo '((x*8)*-1)//2' > answer.py
