#!/bin/bash
# Oracle of rl360/arith-26: writes the canonical answer.
cd /app
echo '((x+3)%3)-5' > answer.py
