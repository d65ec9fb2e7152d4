#!/bin/bash
# Oracle of rl360/copy-file-01.
cd /app
cp entry.txt animal.txt
