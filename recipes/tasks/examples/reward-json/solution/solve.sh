#!/bin/bash
printf '%s\n' 2 3 5 7 11 13 17 19 23 29 > /app/primes.txt
