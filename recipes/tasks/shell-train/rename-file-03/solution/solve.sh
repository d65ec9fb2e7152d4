#!/bin/bash
# Oracle of rl360/rename-file-03.
cd /app
mv result.txt plant.txt
