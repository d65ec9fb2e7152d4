#!/bin/sh
greet rl360 > /app/greeting.txt
