#!/bin/bash
# Oracle of rl360/upper-case-02.
cd /app
tr a-z A-Z < animal.txt > color.txt
