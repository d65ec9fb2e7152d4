#!/bin/bash
# Oracle of rl360/make-dir-medium-09.
cd /app
mkdir -p color/city
