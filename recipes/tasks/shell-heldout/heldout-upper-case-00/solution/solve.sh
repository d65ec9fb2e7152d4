#!/bin/bash
# Oracle of rl360/heldout-upper-case-00.
cd /app
tr a-z A-Z < letter.txt > report.txt
