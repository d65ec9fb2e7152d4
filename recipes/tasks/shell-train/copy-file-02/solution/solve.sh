#!/bin/bash
# Oracle of rl360/copy-file-02.
cd /app
cp plant.txt word.txt
