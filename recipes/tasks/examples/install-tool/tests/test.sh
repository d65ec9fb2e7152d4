#!/bin/sh
# Reward 1 when /app/greeting.txt is exactly what the installed tool prints for "rl360".
mkdir -p /logs/verifier
want=$(greet rl360 2>/dev/null)
if [ -n "$want" ] && [ -f /app/greeting.txt ] && [ "$(cat /app/greeting.txt)" = "$want" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
