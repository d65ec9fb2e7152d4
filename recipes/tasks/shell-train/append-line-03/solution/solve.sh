#!/bin/bash
# Oracle of rl360/append-line-03.
cd /app
echo silver >> info.txt
