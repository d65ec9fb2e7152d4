#!/bin/bash
# Oracle of rl360/upper-case-medium-09.
cd /app
echo ANCHOR > word.txt
