#!/bin/sh
printf 'Hello, world!\n' > /app/hello.txt
