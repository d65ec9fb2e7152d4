#!/bin/bash
# Oracle of rl360/copy-file-03.
cd /app
cp list.txt out.txt
