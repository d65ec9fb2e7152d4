#!/bin/sh
# greet NAME: prints "<greeting>, NAME! (greet <version>)".
HOME_DIR=${GREETER_HOME:-/opt/greeter}
if [ "${1:-}" = "--version" ]; then
    echo "greet $(cat "$HOME_DIR/share/version")"
    exit 0
fi
[ -n "${1:-}" ] || { echo "usage: greet NAME" >&2; exit 2; }
echo "$(cat "$HOME_DIR/share/greeting"), $1! (greet $(cat "$HOME_DIR/share/version"))"
