#!/bin/bash
# Oracle of rl360/make-dir-hard-09.
cd /app
mkdir items data && touch data/list.txt
