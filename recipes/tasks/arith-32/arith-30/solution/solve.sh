#!/bin/bash
# Oracle of rl360/arith-30: writes the canonical answer.
cd /app
echo '((x**2)//3)*2' > answer.py
