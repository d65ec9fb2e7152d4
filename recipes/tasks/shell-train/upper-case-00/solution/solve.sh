#!/bin/bash
# Oracle of rl360/upper-case-00.
cd /app
tr a-z A-Z < todo.txt > entry.txt
