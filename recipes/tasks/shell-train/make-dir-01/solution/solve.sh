#!/bin/bash
# Oracle of rl360/make-dir-01.
cd /app
mkdir jacket
