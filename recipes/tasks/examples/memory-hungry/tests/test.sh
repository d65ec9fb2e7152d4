#!/bin/bash
mkdir -p /logs/verifier
cd /app
if python3 -c '
import sys
sys.path.insert(0, "/app")
from fill import fill
size = 300 * 1024 * 1024
data = fill(size)
assert isinstance(data, bytes) and len(data) == size
assert data[0] == 0x2a and data[size // 2] == 0x2a and data[-1] == 0x2a
print("ok")
'; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
