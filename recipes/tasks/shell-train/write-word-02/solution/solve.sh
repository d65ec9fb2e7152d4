#!/bin/bash
# Oracle of rl360/write-word-02.
cd /app
echo candle > todo.txt
