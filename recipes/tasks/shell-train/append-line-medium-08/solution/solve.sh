#!/bin/bash
# Oracle of rl360/append-line-medium-08.
cd /app
cat data.txt >> record.txt
