#!/usr/bin/env bash
# Emulated SSH nodes: one sshd per node nX on its own loopback address
# 127.0.1.X, port RL360_DEV_SSH_PORT (2222), with its own host key. A session
# gets DOCKER_HOST of that node's dockerd (docker-nodes.sh), so
# `ssh root@127.0.1.X docker ...` talks to node nX.
#
#   sshd-nodes.sh up [N=3]      install if missing, write keys/configs, start
#   sshd-nodes.sh down          stop what this script started (by pid file)
#   sshd-nodes.sh status        one line per sshd
#   sshd-nodes.sh stop-node nX / start-node nX
#
# Writes $DEV_ROOT/ssh/nodes.json (see docs/dev-cluster.md).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV_LOG_PREFIX=sshd-nodes
# shellcheck source=lib.sh
source "$HERE/lib.sh"

dev_settings "$DEV_ROOT/ssh/settings.env" RL360_DEV_SSH_PORT=2222
SSH_PORT=$RL360_DEV_SSH_PORT
SSH_DIR=$DEV_ROOT/ssh
KEY=$SSH_DIR/id_ed25519
KNOWN=$SSH_DIR/known_hosts
CLIENT_CFG=$SSH_DIR/ssh_config
DOCKER_DIR=$DEV_ROOT/docker

node_addr() { echo "127.0.1.${1#n}"; }
node_pidfile() { echo "$SSH_DIR/$1/rl360.pid"; }

check_node_name() {
    [[ "${1:-}" =~ ^n[0-9]+$ ]] && [ "${1#n}" -ge 1 ] && [ "${1#n}" -le 254 ] \
        || dev_die "node name must be n1..n254 (got '${1:-}')"
}

known_nodes() {
    local d
    for d in "$SSH_DIR"/n[0-9]*; do [ -d "$d" ] && basename "$d"; done | sort -V
}

# Client key pair (kept across up/down so known_hosts/authorized_keys hold).
ensure_client_key() {
    mkdir -p "$SSH_DIR"
    chmod 0700 "$SSH_DIR"
    if [ ! -s "$KEY" ]; then
        ssh-keygen -q -t ed25519 -N '' -C rl360-dev-client -f "$KEY"
        dev_log "client key: generated $KEY"
    fi
    cp "$KEY.pub" "$SSH_DIR/authorized_keys"
    chmod 0600 "$SSH_DIR/authorized_keys"
}

write_node_config() {
    local n=$1 d addr
    d=$SSH_DIR/$n; addr=$(node_addr "$n")
    mkdir -p "$d"
    [ -s "$d/ssh_host_ed25519_key" ] \
        || ssh-keygen -q -t ed25519 -N '' -C "rl360-dev-$n" -f "$d/ssh_host_ed25519_key"
    dev_write_if_changed "$d/sshd_config" <<EOF && echo "$n" >>"$SSH_DIR/.changed" || true
# Written by cluster/dev/sshd-nodes.sh for emulated node $n.
ListenAddress $addr:$SSH_PORT
HostKey $d/ssh_host_ed25519_key
PidFile $d/sshd.pid
AuthorizedKeysFile $SSH_DIR/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 100:30:200
MaxSessions 64
ClientAliveInterval 30
LogLevel INFO
SetEnv DOCKER_HOST=unix://$DOCKER_DIR/$n/docker.sock RL360_NODE=$n
Subsystem sftp internal-sftp
EOF
}

# known_hosts, the client config, and a HOME for tools that only read ~/.ssh
# (the docker SDK's paramiko transport): HOME=$SSH_DIR/home.
write_client_files() {
    local n addr
    {
        for n in "$@"; do
            addr=$(node_addr "$n")
            printf '[%s]:%s,[%s]:%s %s\n' "$addr" "$SSH_PORT" "$n" "$SSH_PORT" \
                "$(cut -d' ' -f1-2 "$SSH_DIR/$n/ssh_host_ed25519_key.pub")"
        done
    } | dev_atomic_write "$KNOWN"
    {
        echo "# Written by cluster/dev/sshd-nodes.sh. Use: ssh -F $CLIENT_CFG n1"
        for n in "$@"; do
            addr=$(node_addr "$n")
            cat <<EOF
Host $n $addr
    HostName $addr
    Port $SSH_PORT
    User root
    IdentityFile $KEY
    IdentitiesOnly yes
    UserKnownHostsFile $KNOWN
    StrictHostKeyChecking yes
    BatchMode yes
    LogLevel ERROR
EOF
        done
    } | dev_atomic_write "$CLIENT_CFG"
    mkdir -p "$SSH_DIR/home/.ssh"
    chmod 0700 "$SSH_DIR/home" "$SSH_DIR/home/.ssh"
    cp "$CLIENT_CFG" "$SSH_DIR/home/.ssh/config"
    cp "$KNOWN" "$SSH_DIR/home/.ssh/known_hosts"
}

start_node() {
    local n=$1 d addr pidfile log t0
    d=$SSH_DIR/$n; addr=$(node_addr "$n"); pidfile=$(node_pidfile "$n"); log=$d/sshd.log
    if dev_running "$pidfile"; then
        if ! grep -qx "$n" "$SSH_DIR/.changed" 2>/dev/null; then
            dev_log "$n: sshd already running on $addr:$SSH_PORT (pid $DEV_PID)"
            return
        fi
        dev_log "$n: sshd_config changed; sshd $(dev_stop "$pidfile" 5)"
    fi
    dev_port_free "$addr" "$SSH_PORT" \
        || dev_die "$addr:$SSH_PORT is taken by another process; set RL360_DEV_SSH_PORT"
    mkdir -p /run/sshd
    chmod 0755 /run/sshd
    t0=$(date +%s%N)
    dev_start "$pidfile" "$log" "$d/sshd_config" /usr/sbin/sshd -D -f "$d/sshd_config" -E "$log"
    dev_wait_tcp "$addr" "$SSH_PORT" 15 "$pidfile" "$log"
    dev_log "$n: sshd started on $addr:$SSH_PORT (pid $DEV_PID, $(dev_ms_since "$t0") ms)"
}

stop_node() {
    dev_log "$1: sshd $(dev_stop "$(node_pidfile "$1")" 5)"
}

write_nodes_json() {
    local n first=1 pid
    {
        printf '{\n  "key_path": %s,\n  "known_hosts": %s,\n  "ssh_config": %s,\n  "home": %s,\n  "nodes": [' \
            "$(dev_json_str "$KEY")" "$(dev_json_str "$KNOWN")" \
            "$(dev_json_str "$CLIENT_CFG")" "$(dev_json_str "$SSH_DIR/home")"
        for n in "$@"; do
            pid=$(dev_pid "$(node_pidfile "$n")" || echo null)
            [ $first = 1 ] || printf ','
            first=0
            printf '\n    {"name": %s, "host": %s, "port": %s, "user": "root", "key_path": %s, "known_hosts": %s, "docker_host": %s, "pid": %s}' \
                "$(dev_json_str "$n")" "$(dev_json_str "$(node_addr "$n")")" "$SSH_PORT" \
                "$(dev_json_str "$KEY")" "$(dev_json_str "$KNOWN")" \
                "$(dev_json_str "unix://$DOCKER_DIR/$n/docker.sock")" "$pid"
        done
        printf '\n  ]\n}\n'
    } | dev_atomic_write "$SSH_DIR/nodes.json"
}

json_nodes() {
    [ -f "$SSH_DIR/nodes.json" ] || return 0
    grep -o '"name": "n[0-9]*"' "$SSH_DIR/nodes.json" | cut -d'"' -f4 | grep -x 'n[0-9][0-9]*' | awk '!seen[$0]++'
}

refresh_json() {
    local nodes
    nodes=$(json_nodes | tr '\n' ' ')
    [ -n "$nodes" ] || return 0
    # shellcheck disable=SC2086
    write_nodes_json $nodes
}

cmd_up() {
    local num=${1:-${RL360_DEV_SSH_NODES:-3}} i n nodes=()
    [[ "$num" =~ ^[1-9][0-9]*$ ]] && [ "$num" -le 254 ] || dev_die "up N: N must be 1..254 (got '$num')"
    dev_need_root
    dev_apt_install openssh-server openssh-client
    ensure_client_key
    for i in $(seq 1 "$num"); do nodes+=("n$i"); done
    for n in $(known_nodes); do
        [ "${n#n}" -gt "$num" ] && dev_running "$(node_pidfile "$n")" && stop_node "$n"
    done
    rm -f "$SSH_DIR/.changed"
    for n in "${nodes[@]}"; do write_node_config "$n"; done
    write_client_files "${nodes[@]}"
    for n in "${nodes[@]}"; do start_node "$n"; done
    rm -f "$SSH_DIR/.changed"
    # One real login per node (also proves the key and known_hosts).
    local t0
    t0=$(date +%s%N)
    local pids=() i=0
    for n in "${nodes[@]}"; do
        ssh -F "$CLIENT_CFG" -o ConnectTimeout=5 "$n" true </dev/null &
        pids+=($!)
    done
    for n in "${nodes[@]}"; do
        wait "${pids[$i]}" || dev_die "$n: ssh login failed (log $SSH_DIR/$n/sshd.log)"
        i=$((i + 1))
    done
    dev_log "ssh: logged in to ${nodes[*]} in $(dev_ms_since "$t0") ms"
    write_nodes_json "${nodes[@]}"
    dev_log "up: ${#nodes[@]} sshd node(s) on port $SSH_PORT; description in $SSH_DIR/nodes.json"
}

cmd_down() {
    local n
    for n in $(known_nodes); do
        if [ -f "$(node_pidfile "$n")" ]; then stop_node "$n"; fi
    done
    rm -f "$SSH_DIR/nodes.json"   # none while down
    dev_log "down: done"
}

cmd_status() {
    local n rc=0 any=0 nodes
    nodes=$(json_nodes)
    [ -n "$nodes" ] || nodes=$(known_nodes)
    for n in $nodes; do
        any=1
        if dev_running "$(node_pidfile "$n")"; then
            dev_log "$n: sshd running on $(node_addr "$n"):$SSH_PORT (pid $DEV_PID)"
        else
            dev_log "$n: sshd not running"; rc=1
        fi
    done
    [ $any = 1 ] || { dev_log "no sshd nodes"; rc=1; }
    return $rc
}

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in status|help|-h|"") ;; *) dev_lock sshd-nodes ;; esac
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down ;;
        status) cmd_status ;;
        stop-node) check_node_name "${1:-}"; stop_node "$1"; refresh_json ;;
        start-node) check_node_name "${1:-}"; rm -f "$SSH_DIR/.changed"; write_node_config "$1"; start_node "$1"; refresh_json ;;
        *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; [ -z "$cmd" ] || [ "$cmd" = help ] || [ "$cmd" = -h ] || exit 2 ;;
    esac
}

main "$@"
