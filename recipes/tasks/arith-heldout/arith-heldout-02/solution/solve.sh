#!/bin/bash
# Oracle of rl360/arith-heldout-02: writes the canonical answer.
cd /app
echo 'x*6' > answer.py
