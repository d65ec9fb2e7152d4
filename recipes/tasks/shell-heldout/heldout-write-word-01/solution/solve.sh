#!/bin/bash
# Oracle of rl360/heldout-write-word-01.
cd /app
echo harbor > letter.txt
