# shellcheck shell=bash
# Shared helpers for the cluster/dev scripts. Source it; do not run it.
#
# Everything lives under DEV_ROOT (RL360_DEV_ROOT, default /tmp/rl360-dev).
# Every daemon is started by dev_start, which records "PID STARTTIME MATCH" in
# a pid file; dev_stop only signals that PID when it is still the same process
# (same start time, command line still containing MATCH). Nothing here kills
# by name.

DEV_ROOT=${RL360_DEV_ROOT:-/tmp/rl360-dev}
export DEV_CACHE=${RL360_DEV_CACHE:-$DEV_ROOT/cache}
DEV_LOG_PREFIX=${DEV_LOG_PREFIX:-rl360-dev}
DEV_T0=${DEV_T0:-$(date +%s%N)}

# One line per step, with the seconds since the script started.
dev_log() {
    local now
    now=$(date +%s%N)
    printf '[%s %6.2fs] %s\n' "$DEV_LOG_PREFIX" "$(( (now - DEV_T0) / 1000000 ))e-3" "$*"
}

dev_die() {
    printf '[%s] ERROR: %s\n' "$DEV_LOG_PREFIX" "$*" >&2
    exit 1
}

# Milliseconds since an epoch-ns stamp (for "took N ms" messages).
dev_ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

dev_need_root() {
    [ "$(id -u)" = 0 ] || dev_die "run as root (the dev services start daemons and install packages)"
}

# dev_lock NAME: hold $DEV_ROOT/.NAME.lock until the script exits, so two
# "up"/"down" of the same service do not interleave (waits up to 10 min).
# The fd is not inherited by daemons: dev_start closes fds above 2.
dev_lock() {
    mkdir -p "$DEV_ROOT"
    exec 9>"$DEV_ROOT/.$1.lock"
    flock -w 600 9 || dev_die "another $1 command holds $DEV_ROOT/.$1.lock"
}

# ---------------------------------------------------------------- packages

# dev_pkg_installed PKG: true when dpkg has PKG fully installed.
dev_pkg_installed() {
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

# dev_apt_install PKG...: install the missing ones (no recommends, no
# prompts). Tries without `apt-get update` first, updates once on failure.
dev_apt_install() {
    local missing=() p t0 log
    for p in "$@"; do dev_pkg_installed "$p" || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    mkdir -p "$DEV_ROOT/logs"
    log="$DEV_ROOT/logs/apt.log"
    t0=$(date +%s%N)
    dev_log "apt: installing ${missing[*]} (log $log)"
    local apt=(apt-get -y -q -o DPkg::Lock::Timeout=300 install --no-install-recommends)
    if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" >>"$log" 2>&1; then
        dev_log "apt: install failed, running apt-get update and retrying"
        DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300 update >>"$log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" >>"$log" 2>&1 \
            || { tail -n 20 "$log" >&2; dev_die "apt-get install ${missing[*]} failed (see $log)"; }
    fi
    dev_log "apt: installed ${missing[*]} in $(dev_ms_since "$t0") ms"
}

# ---------------------------------------------------------------- processes

# dev_proc_starttime PID: field 22 of /proc/PID/stat (clock ticks since boot).
dev_proc_starttime() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }            # drop "pid (comm) "; comm may contain spaces
    # shellcheck disable=SC2086
    set -- $stat                 # $1 = state (field 3), starttime = field 22 -> $20
    echo "${20}"
}

# dev_proc_state PID: one letter (R, S, D, Z, ...) or nothing.
dev_proc_state() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    echo "${stat%% *}"
}

dev_proc_cmdline() { { tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null; }

# dev_pid_alive PID STARTTIME MATCH: the same process (not a zombie), still
# running a command line that contains MATCH.
dev_pid_alive() {
    local pid=$1 st=$2 match=$3 state
    [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
    state=$(dev_proc_state "$pid") || return 1
    case $state in Z|X|x|"") return 1 ;; esac
    [ "$(dev_proc_starttime "$pid")" = "$st" ] || return 1
    [[ "$(dev_proc_cmdline "$pid")" == *"$match"* ]] || return 1
}

# dev_pidfile_read PIDFILE: sets DEV_PID DEV_PST DEV_PMATCH; false if none.
dev_pidfile_read() {
    DEV_PID=; DEV_PST=; DEV_PMATCH=
    [ -f "$1" ] || return 1
    { read -r DEV_PID; read -r DEV_PST; read -r DEV_PMATCH; } <"$1" || true
    [ -n "$DEV_PID" ]
}

# dev_running PIDFILE: the process recorded there is alive.
dev_running() {
    dev_pidfile_read "$1" && dev_pid_alive "$DEV_PID" "$DEV_PST" "$DEV_PMATCH"
}

# dev_pid PIDFILE: print the recorded pid when alive.
dev_pid() { dev_running "$1" && echo "$DEV_PID"; }

# dev_start PIDFILE LOGFILE MATCH CMD...: start CMD in its own session
# (setsid, stdin /dev/null, stdout+stderr appended to LOGFILE, no inherited
# fds > 2), record "PID STARTTIME MATCH" in PIDFILE. MATCH is a string the
# command line must contain (e.g. a config path unique to this daemon); it is
# checked again before any signal is sent. The command must stay in the
# foreground (no self-daemonizing) so that the recorded PID is the daemon.
# Sets DEV_PID. Returns 0 without starting when already running.
dev_start() {
    local pidfile=$1 logfile=$2 match=$3 pid st
    shift 3
    if dev_running "$pidfile"; then return 0; fi
    mkdir -p "$(dirname "$pidfile")" "$(dirname "$logfile")"
    (
        for fd in /proc/"$BASHPID"/fd/*; do
            fd=${fd##*/}
            [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"
        done
        unset HTTP_PROXY HTTPS_PROXY http_proxy https_proxy ALL_PROXY all_proxy
        cd /    # do not pin the caller's directory
        exec setsid "$@" </dev/null >>"$logfile" 2>&1
    ) &
    pid=$!
    # The start time does not change across exec; the program does: wait
    # until the subshell has exec'd through setsid into the command and its
    # command line shows MATCH, before recording.
    local shell_exe exe
    shell_exe=$(readlink "/proc/$$/exe")
    for _ in $(seq 1 300); do
        [ -d "/proc/$pid" ] || break
        exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
        if [ -n "$exe" ] && [ "$exe" != "$shell_exe" ] && [ "${exe##*/}" != setsid ] \
            && [[ "$(dev_proc_cmdline "$pid")" == *"$match"* ]]; then
            break
        fi
        sleep 0.01
    done
    st=$(dev_proc_starttime "$pid") || {
        tail -n 20 "$logfile" >&2 2>/dev/null
        dev_die "$1 exited at once: $* (log $logfile)"
    }
    printf '%s\n%s\n%s\n' "$pid" "$st" "$match" >"$pidfile"
    DEV_PID=$pid
}

# dev_wait_gone PID STARTTIME MATCH SECONDS: true once the process is gone
# (a zombie counts as gone: PID 1 here reaps slowly).
dev_wait_gone() {
    local pid=$1 st=$2 match=$3 deadline
    deadline=$(( $(date +%s%N) + ${4%.*} * 1000000000 ))
    while dev_pid_alive "$pid" "$st" "$match"; do
        [ "$(date +%s%N)" -ge "$deadline" ] && return 1
        sleep 0.05
    done
}

# dev_stop PIDFILE [GRACE_SECONDS=10] [SIGNAL=TERM]: TERM, wait, KILL. Only
# signals the recorded process when it is still the one we started. Prints
# "stopped", "killed" or "not running" (no newline handling by caller).
dev_stop() {
    local pidfile=$1 grace=${2:-10} sig=${3:-TERM}
    if ! dev_pidfile_read "$pidfile"; then echo "not running"; return 0; fi
    if ! dev_pid_alive "$DEV_PID" "$DEV_PST" "$DEV_PMATCH"; then
        rm -f "$pidfile"; echo "not running"; return 0
    fi
    kill "-$sig" "$DEV_PID" 2>/dev/null || true
    if dev_wait_gone "$DEV_PID" "$DEV_PST" "$DEV_PMATCH" "$grace"; then
        rm -f "$pidfile"
        if [ "$sig" = KILL ]; then echo "killed (pid $DEV_PID)"; else echo "stopped (pid $DEV_PID)"; fi
        return 0
    fi
    if dev_pid_alive "$DEV_PID" "$DEV_PST" "$DEV_PMATCH"; then
        kill -KILL "$DEV_PID" 2>/dev/null || true
    fi
    dev_wait_gone "$DEV_PID" "$DEV_PST" "$DEV_PMATCH" 5 || dev_die "pid $DEV_PID survived SIGKILL"
    rm -f "$pidfile"
    echo "killed after ${grace}s (pid $DEV_PID)"
}

# dev_kill PIDFILE: SIGKILL at once (fault injection), same identity checks.
dev_kill() { dev_stop "$1" 0 KILL; }

# dev_pids_matching STRING: pids (not zombies) whose command line contains
# STRING. Used only with strings that are paths under DEV_ROOT, to find the
# children our own daemons left behind (containerd, shims) - never by name.
dev_pids_matching() {
    local f pid state
    # One grep over all command lines (fast); zombies have empty cmdlines.
    for f in $(grep -lsaF -- "$1" /proc/[0-9]*/cmdline 2>/dev/null); do
        pid=${f#/proc/}; pid=${pid%/cmdline}
        [ "$pid" = "$$" ] || [ "$pid" = "${BASHPID:-}" ] && continue
        state=$(dev_proc_state "$pid") || continue
        [ "$state" = Z ] && continue
        echo "$pid"
    done
}

# dev_umount_under DIR: unmount every mount point below (or at) DIR, deepest
# first. For mounts our own daemons made (dockerd's private bind of its data
# root, overlay mounts of containers killed with their daemon).
dev_umount_under() {
    local dir=${1%/} mp
    awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo \
        | sort -r | while read -r mp; do
            umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
        done
}

# ---------------------------------------------------------------- waiting

# dev_wait CMD... with DEV_WAIT_TIMEOUT (s, default 30) and DEV_WAIT_PIDFILE
# (fail fast when that daemon died) set by the caller. CMD is retried.
dev_wait() {
    local timeout=${DEV_WAIT_TIMEOUT:-30} deadline
    deadline=$(( $(date +%s%N) + timeout * 1000000000 ))
    until "$@" >/dev/null 2>&1; do
        if [ -n "${DEV_WAIT_PIDFILE:-}" ] && ! dev_running "$DEV_WAIT_PIDFILE"; then
            return 2
        fi
        [ "$(date +%s%N)" -ge "$deadline" ] && return 1
        sleep 0.05
    done
}

# dev_tcp_open HOST PORT: something accepts connections there.
dev_tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# dev_port_free HOST PORT
dev_port_free() { ! dev_tcp_open "$1" "$2"; }

# dev_wait_tcp HOST PORT TIMEOUT [PIDFILE] [LOGFILE]
dev_wait_tcp() {
    local rc=0
    DEV_WAIT_TIMEOUT=$3 DEV_WAIT_PIDFILE=${4:-} dev_wait dev_tcp_open "$1" "$2" || rc=$?
    [ $rc -eq 0 ] && return 0
    [ -n "${5:-}" ] && tail -n 20 "$5" >&2 2>/dev/null
    [ $rc -eq 2 ] && dev_die "daemon for $1:$2 died while starting (log ${5:-?})"
    dev_die "nothing listens on $1:$2 after $3 s (log ${5:-?})"
}

dev_socket_ready() { [ -S "$1" ]; }

# dev_wait_socket PATH TIMEOUT [PIDFILE] [LOGFILE]
dev_wait_socket() {
    local rc=0
    DEV_WAIT_TIMEOUT=$2 DEV_WAIT_PIDFILE=${3:-} dev_wait dev_socket_ready "$1" || rc=$?
    [ $rc -eq 0 ] && return 0
    [ -n "${4:-}" ] && tail -n 20 "$4" >&2 2>/dev/null
    [ $rc -eq 2 ] && dev_die "daemon for $1 died while starting (log ${4:-?})"
    dev_die "socket $1 did not appear after $2 s (log ${4:-?})"
}

# ---------------------------------------------------------------- files

# dev_write_if_changed PATH: write stdin to PATH only when the content
# differs (so "up" twice does not touch configs); returns 0 when changed.
dev_write_if_changed() {
    local tmp
    tmp=$(mktemp "$1.XXXXXX")
    cat >"$tmp"
    if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 1; fi
    chmod 0644 "$tmp"
    mv -f "$tmp" "$1"
    return 0
}

# dev_atomic_write PATH: stdin -> PATH via rename (readers never see half).
dev_atomic_write() {
    local tmp
    tmp=$(mktemp "$1.XXXXXX")
    cat >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$1"
}

# dev_settings FILE NAME=DEFAULT...: resolve each setting (an RL360_DEV_*
# variable) as: the environment if set, else what FILE recorded at the last
# "up", else DEFAULT; export it and record the result in FILE. So a cluster
# started with RL360_DEV_SSH_PORT=2322 keeps that port for later commands
# (down, kill-node, ...) run without the variable.
dev_settings() {
    local file=$1 spec name def val saved
    shift
    mkdir -p "$(dirname "$file")"
    local out=""
    for spec in "$@"; do
        name=${spec%%=*}; def=${spec#*=}
        if [ -n "${!name:-}" ]; then
            val=${!name}
        else
            saved=$(grep -s "^$name=" "$file" | tail -n1 | cut -d= -f2- || true)
            val=${saved:-$def}
        fi
        [[ "$val" =~ ^[A-Za-z0-9._/:-]*$ ]] || dev_die "$name has odd characters: '$val'"
        export "$name=$val"
        out+="$name=$val"$'\n'
    done
    printf '%s' "$out" | dev_write_if_changed "$file" || true
}

# dev_json_str STRING: a JSON string literal (for the simple values we write:
# paths, names, addresses).
dev_json_str() {
    local s=$1
    s=${s//\\/\\\\}; s=${s//\"/\\\"}
    printf '"%s"' "$s"
}
