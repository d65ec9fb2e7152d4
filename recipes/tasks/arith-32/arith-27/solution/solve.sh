#!/bin/bash
# Oracle of rl360/arith-27: writes the canonical answer.
cd /app
echo '((x%9)%4)*2' > answer.py
