#!/bin/bash
# Oracle of rl360/arith-26: writes the canonical answer.
cd /app
echo '((x*2)+6)**2' > answer.py
