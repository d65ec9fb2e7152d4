#!/bin/bash
# Oracle of rl360/make-dir-02.
cd /app
mkdir log
