#!/bin/bash
# Oracle of rl360/make-dir-00.
cd /app
mkdir list
