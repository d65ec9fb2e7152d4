#!/bin/bash
# Oracle of rl360/make-dir-04.
cd /app
mkdir result
