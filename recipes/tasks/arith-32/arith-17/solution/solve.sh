#!/bin/bash
# Oracle of rl360/arith-17: writes the canonical answer.
cd /app
echo '(x//3)+3' > answer.py
