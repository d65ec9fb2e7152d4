#!/bin/bash
# Oracle of rl360/write-word-03.
cd /app
echo anchor > city.txt
