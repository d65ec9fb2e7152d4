#!/bin/bash
# Oracle of rl360/heldout-upper-case-01.
cd /app
tr a-z A-Z < title.txt > answer.txt
