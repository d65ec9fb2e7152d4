#!/bin/bash
# Oracle of rl360/arith-heldout-15: writes the canonical answer.
cd /app
echo '((x+6)%9)-8' > answer.py
