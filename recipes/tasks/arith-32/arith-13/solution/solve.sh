#!/bin/bash
# Oracle of rl360/arith-13: writes the canonical answer.
cd /app
echo '(x//8)*3' > answer.py
