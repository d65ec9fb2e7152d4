#!/bin/sh
total=0
while read -r n; do total=$((total + n)); done < /app/numbers.txt
echo "$total" > /app/answer.txt
