#!/bin/bash
# Oracle of rl360/make-dir-medium-08.
cd /app
mkdir -p record/city
