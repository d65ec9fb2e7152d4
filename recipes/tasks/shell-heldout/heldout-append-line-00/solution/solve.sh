#!/bin/bash
# Oracle of rl360/heldout-append-line-00.
cd /app
echo banana >> title.txt
