#!/bin/bash
# Oracle of rl360/two-words-02.
cd /app
echo 'forest candle' > log.txt
