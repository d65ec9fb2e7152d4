#!/bin/bash
# Oracle of rl360/arith-heldout-04: writes the canonical answer.
cd /app
echo '(x*4)-6' > answer.py
