#!/bin/bash
# Oracle of rl360/arith-06: writes the canonical answer.
cd /app
echo 'x*-1' > answer.py
