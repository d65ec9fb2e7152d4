#!/bin/bash
# Oracle of rl360/upper-case-08.
cd /app
tr a-z A-Z < city.txt > out.txt
