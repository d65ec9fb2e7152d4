#!/bin/bash
# Oracle of rl360/write-word-07.
cd /app
echo tiger > list.txt
