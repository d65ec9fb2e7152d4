#!/bin/bash
# Oracle of rl360/make-dir-hard-08.
cd /app
mkdir todo memo && touch memo/city.txt
