# Shared by every step's test.sh (the task's tests/ is uploaded under each step's own).
mkdir -p /logs/verifier
reward() { echo "$1" > /logs/verifier/reward.txt; exit 0; }
line() { sed -n "$1p" /app/notes.txt 2>/dev/null; }
