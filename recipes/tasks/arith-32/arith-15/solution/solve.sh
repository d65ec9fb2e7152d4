#!/bin/bash
# Oracle of rl360/arith-15: writes the canonical answer.
cd /app
echo '(x*7)*4' > answer.py
