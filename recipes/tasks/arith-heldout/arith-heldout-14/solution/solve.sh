#!/bin/bash
# Oracle of rl360/arith-heldout-14: writes the canonical answer.
cd /app
echo '((x%9)+7)*-1' > answer.py
