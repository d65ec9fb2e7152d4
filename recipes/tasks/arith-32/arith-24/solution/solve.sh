#!/bin/bash
# Oracle of rl360/arith-24: writes the canonical answer.
cd /app
echo '((x*-1)+3)%3' > answer.py
