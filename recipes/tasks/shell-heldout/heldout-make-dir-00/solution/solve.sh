#!/bin/bash
# Oracle of rl360/heldout-make-dir-00.
cd /app
mkdir title
