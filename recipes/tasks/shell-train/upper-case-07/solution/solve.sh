#!/bin/bash
# Oracle of rl360/upper-case-07.
cd /app
tr a-z A-Z < record.txt > animal.txt
