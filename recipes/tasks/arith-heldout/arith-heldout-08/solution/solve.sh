#!/bin/bash
# Oracle of rl360/arith-heldout-08: writes the canonical answer.
cd /app
echo '(x-3)*7' > answer.py
