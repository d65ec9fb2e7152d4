#!/bin/bash
# Oracle of rl360/heldout-python-fix-01.
cd /app
sed -i 's/pencil/falcon/' message.py
