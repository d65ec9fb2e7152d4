#!/bin/bash
# Oracle of rl360/two-words-hard-08.
cd /app
echo button > entry.txt && echo garden >> entry.txt
