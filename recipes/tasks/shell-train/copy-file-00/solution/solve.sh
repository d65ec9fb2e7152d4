#!/bin/bash
# Oracle of rl360/copy-file-00.
cd /app
cp animal.txt city.txt
