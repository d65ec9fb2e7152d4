#!/bin/bash
# Oracle of rl360/append-line-02.
cd /app
echo lemon >> notes.txt
