#!/bin/bash
# Oracle of rl360/arith-23: writes the canonical answer.
cd /app
echo '(x**2)+3' > answer.py
