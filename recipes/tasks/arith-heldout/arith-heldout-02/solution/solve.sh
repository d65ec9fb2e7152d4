#!/bin/bash
# Oracle of rl360/arith-heldout-02: writes the canonical answer.
cd /app
echo '(x*7)+2' > answer.py
