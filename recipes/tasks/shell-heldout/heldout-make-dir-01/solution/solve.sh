#!/bin/bash
# Oracle of rl360/heldout-make-dir-01.
cd /app
mkdir copper
