#!/bin/bash
# Oracle of rl360/rename-file-01.
cd /app
mv result.txt draft.txt
