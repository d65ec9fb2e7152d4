#!/bin/bash
# Oracle of rl360/copy-file-hard-09.
cd /app
mkdir entry && cp animal.txt entry/
