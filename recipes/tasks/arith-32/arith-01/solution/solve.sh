#!/bin/bash
# Oracle of rl360/arith-01: writes the canonical answer.
cd /app
echo 'x-2' > answer.py
