#!/bin/bash
# Oracle of rl360/upper-case-hard-08.
cd /app
tr a-z A-Z < list.txt > list.txt.tmp && mv list.txt.tmp list.txt
