#!/bin/bash
# Oracle of rl360/make-dir-07.
cd /app
mkdir tiger
