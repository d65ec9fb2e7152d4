#!/bin/bash
# Oracle of rl360/arith-03: writes the canonical answer.
cd /app
echo 'x%4' > answer.py
