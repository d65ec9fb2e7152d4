#!/bin/bash
# Oracle of rl360/arith-22: writes the canonical answer.
cd /app
echo '((x**2)+3)**2' > answer.py
