#!/bin/bash
# Oracle of rl360/upper-case-01.
cd /app
tr a-z A-Z < entry.txt > color.txt
