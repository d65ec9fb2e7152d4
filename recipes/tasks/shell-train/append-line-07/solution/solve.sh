#!/bin/bash
# Oracle of rl360/append-line-07.
cd /app
echo pepper >> list.txt
