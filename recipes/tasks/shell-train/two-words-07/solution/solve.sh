#!/bin/bash
# Oracle of rl360/two-words-07.
cd /app
echo 'river tiger' > animal.txt
