#!/bin/bash
# Oracle of rl360/arith-29: writes the canonical answer.
cd /app
echo '((x//6)*8)//2' > answer.py
