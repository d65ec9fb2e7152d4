#!/bin/bash
# Oracle of rl360/two-words-03.
cd /app
echo 'lemon forest' > entry.txt
