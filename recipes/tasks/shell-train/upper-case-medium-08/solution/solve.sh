#!/bin/bash
# Oracle of rl360/upper-case-medium-08.
cd /app
echo LEMON > todo.txt
