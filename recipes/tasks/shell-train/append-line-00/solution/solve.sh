#!/bin/bash
# Oracle of rl360/append-line-00.
cd /app
echo pepper >> items.txt
