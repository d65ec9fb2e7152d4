#!/bin/sh
echo "Hello, $(cat /app/name.txt)!" >> /app/notes.txt
