#!/bin/bash
# Oracle of rl360/make-dir-08.
cd /app
mkdir orange
