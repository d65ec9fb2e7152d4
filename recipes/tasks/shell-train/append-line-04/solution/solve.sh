#!/bin/bash
# Oracle of rl360/append-line-04.
cd /app
echo rocket >> notes.txt
