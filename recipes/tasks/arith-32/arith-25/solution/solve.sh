#!/bin/bash
# Oracle of rl360/arith-25: writes the canonical answer.
cd /app
echo '((x-5)%9)%4' > answer.py
