#!/bin/bash
# Oracle of rl360/write-word-08.
cd /app
echo stone > animal.txt
