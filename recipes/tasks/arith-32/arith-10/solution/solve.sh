#!/bin/bash
# Oracle of rl360/arith-10: writes the canonical answer.
cd /app
echo 'x**2' > answer.py
