#!/bin/sh
. /tests/helpers.sh
[ "$(line 1)" = "notes" ] && reward 1
reward 0
