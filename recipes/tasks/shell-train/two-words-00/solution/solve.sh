#!/bin/bash
# Oracle of rl360/two-words-00.
cd /app
echo 'river violet' > draft.txt
