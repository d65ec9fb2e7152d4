#!/bin/bash
# Oracle of rl360/arith-02: writes the canonical answer.
cd /app
echo 'x-3' > answer.py
