#!/bin/bash
# Oracle of rl360/rename-file-02.
cd /app
mv city.txt log.txt
