#!/bin/sh
# Half the reward for keeping step 1's line, half for the greeting.
. /tests/helpers.sh
score=0
[ "$(line 1)" = "notes" ] && score=$((score + 1))
[ "$(line 2)" = "$EXPECTED_GREETING" ] && score=$((score + 1))
case $score in 2) reward 1 ;; 1) reward 0.5 ;; *) reward 0 ;; esac
