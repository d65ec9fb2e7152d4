#!/bin/bash
# Oracle of rl360/upper-case-04.
cd /app
tr a-z A-Z < out.txt > log.txt
