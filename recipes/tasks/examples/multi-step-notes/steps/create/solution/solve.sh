#!/bin/sh
echo notes > /app/notes.txt
