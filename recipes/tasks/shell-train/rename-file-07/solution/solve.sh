#!/bin/bash
# Oracle of rl360/rename-file-07.
cd /app
mv data.txt out.txt
