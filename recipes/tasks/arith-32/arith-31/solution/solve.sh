#!/bin/bash
# Oracle of rl360/arith-31: writes the canonical answer.
cd /app
echo '((x//6)-5)*-1' > answer.py
