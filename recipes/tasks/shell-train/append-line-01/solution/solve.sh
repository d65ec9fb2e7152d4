#!/bin/bash
# Oracle of rl360/append-line-01.
cd /app
echo button >> draft.txt
