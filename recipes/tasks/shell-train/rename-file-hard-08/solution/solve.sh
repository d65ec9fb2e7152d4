#!/bin/bash
# Oracle of rl360/rename-file-hard-08.
cd /app
mv city.txt items.txt && mv todo.txt plant.txt
