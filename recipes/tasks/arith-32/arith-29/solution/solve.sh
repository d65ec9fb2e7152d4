#!/bin/bash
# Oracle of rl360/arith-29: writes the canonical answer.
cd /app
echo '((x*2)*-1)-3' > answer.py
