#!/bin/bash
# Oracle of rl360/write-word-hard-08.
cd /app
mkdir name && echo forest > name/name.txt
