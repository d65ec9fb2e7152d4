#!/bin/bash
# Oracle of rl360/write-word-hard-09.
cd /app
mkdir draft && echo orange > draft/fruit.txt
