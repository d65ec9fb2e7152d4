#!/bin/bash
# Oracle of rl360/two-words-hard-09.
cd /app
echo candle > info.txt && echo orange >> info.txt
