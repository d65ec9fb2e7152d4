#!/bin/bash
# Oracle of rl360/arith-21: writes the canonical answer.
cd /app
echo '(x+8)+5' > answer.py
