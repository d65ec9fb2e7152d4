#!/bin/sh
# Installs greet into PREFIX (bin/greet and share/greeting), with a version stamp.
set -eu
PREFIX=$1
HERE=$(dirname "$0")
mkdir -p "$PREFIX/bin" "$PREFIX/share"
cp "$HERE/greet.sh" "$PREFIX/bin/greet"
chmod 755 "$PREFIX/bin/greet"
printf 'Greetings' > "$PREFIX/share/greeting"
printf '1.0.0\n' > "$PREFIX/share/version"
