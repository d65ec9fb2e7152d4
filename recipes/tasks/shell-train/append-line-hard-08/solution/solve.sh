#!/bin/bash
# Oracle of rl360/append-line-hard-08.
cd /app
echo orange >> out.txt && echo candle >> out.txt
