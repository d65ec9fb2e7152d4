#!/bin/bash
# Oracle of rl360/copy-file-08.
cd /app
cp name.txt out.txt
