#!/bin/bash
# Oracle of rl360/append-line-08.
cd /app
echo button >> info.txt
