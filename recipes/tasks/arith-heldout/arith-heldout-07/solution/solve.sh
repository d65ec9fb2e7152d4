#!/bin/bash
# Oracle of rl360/arith-heldout-07: writes the canonical answer.
cd /app
echo '(x//8)+3' > answer.py
