#!/bin/bash
# Oracle of rl360/rename-file-00.
cd /app
mv list.txt entry.txt
