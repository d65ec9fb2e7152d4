#!/bin/bash
# Oracle of rl360/arith-heldout-12: writes the canonical answer.
cd /app
echo '((x//5)*-1)-8' > answer.py
