#!/bin/bash
# Oracle of rl360/arith-00: writes the canonical answer.
cd /app
echo 'x-5' > answer.py
