#!/bin/bash
# Oracle of rl360/upper-case-03.
cd /app
tr a-z A-Z < info.txt > out.txt
