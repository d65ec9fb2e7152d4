#!/bin/bash
# Oracle of rl360/arith-19: writes the canonical answer.
cd /app
echo '(x-2)**2' > answer.py
