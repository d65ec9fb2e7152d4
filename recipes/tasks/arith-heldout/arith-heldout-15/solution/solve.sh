#!/bin/bash
# Oracle of rl360/arith-heldout-15: writes the canonical answer.
cd /app
echo '((x+5)//4)*-1' > answer.py
