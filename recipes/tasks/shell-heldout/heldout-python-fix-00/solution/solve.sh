#!/bin/bash
# Oracle of rl360/heldout-python-fix-00.
cd /app
sed -i 's/harbor/falcon/' message.py
