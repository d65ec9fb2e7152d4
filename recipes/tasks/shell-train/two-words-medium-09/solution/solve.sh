#!/bin/bash
# Oracle of rl360/two-words-medium-09.
cd /app
echo 'orange island maple' > plant.txt
