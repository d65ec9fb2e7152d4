#!/bin/bash
# Oracle of rl360/arith-heldout-00: writes the canonical answer.
cd /app
echo '(x//9)*5' > answer.py
