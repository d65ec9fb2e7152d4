#!/bin/bash
# Oracle of rl360/write-word-04.
cd /app
echo forest > list.txt
