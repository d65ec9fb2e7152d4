#!/bin/bash
# Oracle of rl360/arith-31: writes the canonical answer.
cd /app
echo '((x*-1)-3)**2' > answer.py
