#!/bin/bash
# Oracle of rl360/arith-27: writes the canonical answer.
cd /app
echo '((x-7)//6)*8' > answer.py
