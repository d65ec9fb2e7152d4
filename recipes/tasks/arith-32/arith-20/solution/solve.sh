#!/bin/bash
# Oracle of rl360/arith-20: writes the canonical answer.
cd /app
echo '(x*-1)-8' > answer.py
