#!/bin/bash
# Oracle of rl360/arith-28: writes the canonical answer.
cd /app
echo '((x+6)**2)-7' > answer.py
