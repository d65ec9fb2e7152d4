#!/bin/sh
# Reward 1 when /app/hello.txt holds exactly "Hello, world!" (a trailing newline is optional).
mkdir -p /logs/verifier
if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = "Hello, world!" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
