#!/bin/bash
# Oracle of rl360/heldout-append-line-01.
cd /app
echo pencil >> label.txt
