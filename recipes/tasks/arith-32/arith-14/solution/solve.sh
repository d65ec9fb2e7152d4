#!/bin/bash
# Oracle of rl360/arith-14: writes the canonical answer.
cd /app
echo '(x%4)%2' > answer.py
