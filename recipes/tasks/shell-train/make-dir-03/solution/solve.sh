#!/bin/bash
# Oracle of rl360/make-dir-03.
cd /app
mkdir notes
