#!/bin/bash
# Oracle of rl360/upper-case-hard-09.
cd /app
tr a-z A-Z < record.txt > record.txt.tmp && mv record.txt.tmp record.txt
