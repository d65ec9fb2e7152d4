#!/bin/bash
# Oracle of rl360/copy-file-medium-08.
cd /app
cp result.txt entry/
