#!/bin/bash
# Oracle of rl360/rename-file-medium-08.
cd /app
mv list.txt out/
