#!/usr/bin/env bash
# A real Slurm 22.05 cluster on this one machine: munged, a private MariaDB,
# slurmdbd (accounting: sacct works), slurmctld and four fake nodes n1..n4
# (one `slurmd -N nX` each, all on 127.0.0.1 with their own port).
#
#   slurm.sh up            install if missing, write configs, start, check
#   slurm.sh down          cancel jobs, stop what this script started
#   slurm.sh status        one line per daemon, then sinfo
#   slurm.sh kill-node nX  SIGKILL node nX's slurmd and its job steps (a crash)
#   slurm.sh revive-node nX  start nX's slurmd again, wait until it is back
#   slurm.sh purge         down, then delete state, accounting DB and logs
#
# Use it:  source $DEV_ROOT/slurm/env.sh; sbatch --wrap hostname
# Writes $DEV_ROOT/slurm/cluster.json (see docs/dev-cluster.md).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV_LOG_PREFIX=slurm
# shellcheck source=lib.sh
source "$HERE/lib.sh"

S=$DEV_ROOT/slurm
CONF=$S/slurm.conf
DBD_CONF=$S/slurmdbd.conf
MUNGE_DIR=$S/munge
MUNGE_SOCK=$MUNGE_DIR/munge.socket
DB_DIR=$S/mariadb
DB_SOCK=$DB_DIR/mysqld.sock
dev_settings "$S/settings.env" RL360_DEV_MARIADB_PORT=13306 RL360_DEV_SLURMDBD_PORT=6819 \
    RL360_DEV_SLURMCTLD_PORT=6817 RL360_DEV_SLURMD_PORT_BASE=17000 RL360_DEV_SLURM_CLUSTER=rl360dev \
    RL360_DEV_SLURM_NODE_MEM=4000 RL360_DEV_SLURMD_TIMEOUT=5 RL360_DEV_SLURM_MSG_TIMEOUT=5
DB_PORT=$RL360_DEV_MARIADB_PORT
DBD_PORT=$RL360_DEV_SLURMDBD_PORT
CTLD_PORT=$RL360_DEV_SLURMCTLD_PORT
SLURMD_PORT_BASE=$RL360_DEV_SLURMD_PORT_BASE
NUM_NODES=4
CLUSTER=$RL360_DEV_SLURM_CLUSTER
NODE_MEM=$RL360_DEV_SLURM_NODE_MEM
HOST=$(hostname -s)
PACKAGES=(slurm-wlm slurm-client munge slurmdbd mariadb-server-core mariadb-client-core)
export SLURM_CONF=$CONF

NODES=()
for _i in $(seq 1 $NUM_NODES); do NODES+=("n$_i"); done

pidf() { echo "$S/run/$1.rl360pid"; }
node_port() { echo $((SLURMD_PORT_BASE + ${1#n})); }

check_node_name() {
    local n=${1:-}
    [[ "$n" =~ ^n[0-9]+$ ]] && [ "${n#n}" -ge 1 ] && [ "${n#n}" -le $NUM_NODES ] \
        || dev_die "node must be one of ${NODES[*]} (got '$n')"
}

# ---------------------------------------------------------------- configs

write_configs() {
    mkdir -p "$S"/{run,log,state,spool} "$MUNGE_DIR" "$DB_DIR"
    # Bind to the address the hostname resolves to, not to every address
    # (NoInAddrAny / NoCtldInAddrAny), when that address is on loopback.
    local haddr comm="" comm_dbd=""
    haddr=$(getent ahostsv4 "$HOST" | awk 'NR == 1 {print $1}')
    if [[ "$haddr" == 127.* ]]; then
        comm="CommunicationParameters=NoInAddrAny,NoCtldInAddrAny"
        comm_dbd="CommunicationParameters=NoInAddrAny"
    else
        dev_log "WARNING: $HOST resolves to '${haddr:-nothing}', not 127.x: Slurm daemons will listen on all addresses"
    fi
    local hw cpus boards sockets cores threads
    hw=$(slurmd -C | head -n1)
    cpus=$(grep -o 'CPUs=[0-9]*' <<<"$hw" | cut -d= -f2)
    boards=$(grep -o 'Boards=[0-9]*' <<<"$hw" | cut -d= -f2)
    sockets=$(grep -o 'SocketsPerBoard=[0-9]*' <<<"$hw" | cut -d= -f2)
    cores=$(grep -o 'CoresPerSocket=[0-9]*' <<<"$hw" | cut -d= -f2)
    threads=$(grep -o 'ThreadsPerCore=[0-9]*' <<<"$hw" | cut -d= -f2)
    local realmem mem
    realmem=$(grep -o 'RealMemory=[0-9]*' <<<"$hw" | cut -d= -f2)
    mem=$NODE_MEM
    [ $((realmem / NUM_NODES)) -lt "$mem" ] && mem=$((realmem / NUM_NODES))
    NODE_CPUS=$cpus NODE_MEMORY=$mem
    CONF_CHANGED=0 DBD_CONF_CHANGED=0
    dev_write_if_changed "$CONF" <<EOF && CONF_CHANGED=1
# Written by cluster/dev/slurm.sh - a dev cluster of ${NUM_NODES} fake nodes on one machine.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
$comm
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/%n
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Heterogeneous jobs wait 24-46 s with the default backfill interval.
SchedulerParameters=bf_interval=1
MpiDefault=none
ReturnToService=2
# A killed slurmd is noticed fast (node-failure tests): the node is DOWN and
# its jobs NODE_FAIL ~15-20 s after the kill. Each ping round waits up to
# MessageTimeout for a dead node, so that bounds detection as much as
# SlurmdTimeout does (defaults 300/10: ~30-55 s measured here).
SlurmdTimeout=$RL360_DEV_SLURMD_TIMEOUT
SlurmctldTimeout=10
MessageTimeout=$RL360_DEV_SLURM_MSG_TIMEOUT
InactiveLimit=0
KillWait=5
MinJobAge=10
# A job on a failed node ends NODE_FAIL instead of being requeued.
JobRequeue=0
MailProg=/bin/true
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# Connections to slurmdbd do not use AuthInfo's socket: without this line
# sacct/sacctmgr/slurmctld look for munged at /run/munge/munge.socket.2.
AccountingStoragePass=$MUNGE_SOCK
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
# ${NUM_NODES} fake nodes share this machine's ${cpus} CPUs (each claims all of them: Slurm accepts it).
NodeName=n[1-$NUM_NODES] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$((SLURMD_PORT_BASE + 1))-$((SLURMD_PORT_BASE + NUM_NODES))] CPUs=$cpus Boards=$boards SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=n[1-$NUM_NODES] Default=YES MaxTime=01:00:00 State=UP
PartitionName=short Nodes=n[1-$NUM_NODES] MaxTime=00:05:00 State=UP
EOF
    # The accounting DB password: made once, kept.
    if [ ! -s "$DB_DIR/slurm.pass" ]; then
        (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DB_DIR/slurm.pass")
    fi
    dev_write_if_changed "$DBD_CONF" <<EOF && DBD_CONF_CHANGED=1
# Written by cluster/dev/slurm.sh.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
$comm_dbd
SlurmUser=root
LogFile=$S/log/slurmdbd.log
PidFile=$S/run/slurmdbd.pid
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(cat "$DB_DIR/slurm.pass")
StorageLoc=slurm_acct_db
EOF
    chmod 0600 "$DBD_CONF"   # slurmdbd refuses a readable one (it holds the DB password)
    dev_write_if_changed "$S/env.sh" <<EOF || true
# Source this to use the dev Slurm cluster: sbatch, srun, squeue, sacct, submitit.
export SLURM_CONF=$CONF
EOF
}

# 127.0.0.1 nX lines in /etc/hosts (added once, never removed).
ensure_hosts() {
    local n added=()
    for n in "${NODES[@]}"; do
        if ! awk -v n="$n" '$1 !~ /^#/ { for (i = 2; i <= NF; i++) if ($i == n) f = 1 } END { exit !f }' /etc/hosts; then
            printf '127.0.0.1 %s  # rl360-dev slurm node\n' "$n" >>/etc/hosts
            added+=("$n")
        fi
    done
    [ ${#added[@]} -eq 0 ] || dev_log "/etc/hosts: added 127.0.0.1 for ${added[*]}"
}

# ---------------------------------------------------------------- daemons

start_munge() {
    local pf
    pf=$(pidf munged)
    if dev_running "$pf"; then dev_log "munged: already running (pid $DEV_PID)"; return; fi
    # munged wants its socket directory searchable by all, the key 0400.
    chown munge:munge "$MUNGE_DIR"; chmod 0755 "$MUNGE_DIR"
    if [ ! -s "$MUNGE_DIR/munge.key" ]; then
        dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
        dev_log "munged: generated key $MUNGE_DIR/munge.key"
    fi
    chown munge:munge "$MUNGE_DIR/munge.key"; chmod 0400 "$MUNGE_DIR/munge.key"
    rm -f "$MUNGE_SOCK" "$MUNGE_SOCK.lock"
    local t0
    t0=$(date +%s%N)
    dev_start "$pf" "$S/log/munged.out" "$MUNGE_SOCK" \
        setpriv --reuid=munge --regid=munge --init-groups -- \
        /usr/sbin/munged -F --socket="$MUNGE_SOCK" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed" --num-threads=4
    dev_wait_socket "$MUNGE_SOCK" 15 "$pf" "$S/log/munged.out"
    dev_log "munged: started (pid $DEV_PID, $MUNGE_SOCK, $(dev_ms_since "$t0") ms)"
}

db() { mariadb --no-defaults -S "$DB_SOCK" -u root "$@"; }

start_mariadb() {
    local pf t0 log=$S/log/mariadb.log
    pf=$(pidf mariadbd)
    if dev_running "$pf"; then dev_log "mariadb: already running on 127.0.0.1:$DB_PORT (pid $DEV_PID)"; return; fi
    t0=$(date +%s%N)
    if [ ! -d "$DB_DIR/data/mysql" ]; then
        rm -rf "$DB_DIR/data"
        mariadb-install-db --no-defaults --user=root --datadir="$DB_DIR/data" \
            --auth-root-authentication-method=socket --skip-test-db \
            >"$S/log/mariadb-install.log" 2>&1 \
            || { tail -n 20 "$S/log/mariadb-install.log" >&2; dev_die "mariadb-install-db failed"; }
        dev_log "mariadb: initialised $DB_DIR/data in $(dev_ms_since "$t0") ms"
        t0=$(date +%s%N)
    fi
    dev_port_free 127.0.0.1 "$DB_PORT" || dev_die "127.0.0.1:$DB_PORT is taken; set RL360_DEV_MARIADB_PORT"
    rm -f "$DB_SOCK"
    dev_start "$pf" "$log" "--datadir=$DB_DIR/data" \
        /usr/sbin/mariadbd --no-defaults --user=root --datadir="$DB_DIR/data" \
        --socket="$DB_SOCK" --port="$DB_PORT" --bind-address=127.0.0.1 \
        --pid-file="$DB_DIR/mysqld.pid" --log-error="$log" --skip-name-resolve \
        --innodb-buffer-pool-size=64M --innodb-log-file-size=48M \
        --innodb-lock-wait-timeout=900 --max-connections=100 --skip-log-bin
    DEV_WAIT_TIMEOUT=30 DEV_WAIT_PIDFILE=$pf dev_wait db -e 'select 1' \
        || { tail -n 20 "$log" >&2; dev_die "mariadb did not come up (log $log)"; }
    local pass
    pass=$(cat "$DB_DIR/slurm.pass")
    db -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
           ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
           GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
    dev_log "mariadb: started on 127.0.0.1:$DB_PORT (pid $DEV_PID, $(dev_ms_since "$t0") ms)"
}

start_slurmdbd() {
    local pf t0 log=$S/log/slurmdbd.log
    pf=$(pidf slurmdbd)
    if dev_running "$pf"; then dev_log "slurmdbd: already running (pid $DEV_PID)"; return; fi
    dev_port_free 127.0.0.1 "$DBD_PORT" || dev_die "127.0.0.1:$DBD_PORT is taken; set RL360_DEV_SLURMDBD_PORT"
    t0=$(date +%s%N)
    dev_start "$pf" "$S/log/slurmdbd.out" "/usr/sbin/slurmdbd -D" /usr/sbin/slurmdbd -D
    dev_wait_tcp 127.0.0.1 "$DBD_PORT" 60 "$pf" "$log"
    dev_log "slurmdbd: started on 127.0.0.1:$DBD_PORT (pid $DEV_PID, $(dev_ms_since "$t0") ms)"
}

register_cluster() {
    if ! sacctmgr -nP list cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
        dev_log "slurmdbd: registered cluster $CLUSTER"
    fi
}

start_slurmctld() {
    local pf t0 log=$S/log/slurmctld.log
    pf=$(pidf slurmctld)
    if dev_running "$pf"; then dev_log "slurmctld: already running (pid $DEV_PID)"; return; fi
    dev_port_free 127.0.0.1 "$CTLD_PORT" || dev_die "127.0.0.1:$CTLD_PORT is taken; set RL360_DEV_SLURMCTLD_PORT"
    t0=$(date +%s%N)
    dev_start "$pf" "$S/log/slurmctld.out" "-f $CONF" /usr/sbin/slurmctld -D -f "$CONF"
    DEV_WAIT_TIMEOUT=30 DEV_WAIT_PIDFILE=$pf dev_wait sh -c 'scontrol ping | grep -q UP' \
        || { tail -n 20 "$log" >&2; dev_die "slurmctld did not come up (log $log)"; }
    dev_log "slurmctld: started on 127.0.0.1:$CTLD_PORT (pid $DEV_PID, $(dev_ms_since "$t0") ms)"
}

start_slurmd() {
    local n=$1 pf port t0 log
    pf=$(pidf "slurmd-$n"); port=$(node_port "$n"); log=$S/log/slurmd-$n.log
    if dev_running "$pf"; then dev_log "$n: slurmd already running (pid $DEV_PID)"; return; fi
    dev_port_free 127.0.0.1 "$port" || dev_die "127.0.0.1:$port is taken; set RL360_DEV_SLURMD_PORT_BASE"
    mkdir -p "$S/spool/$n"
    t0=$(date +%s%N)
    dev_start "$pf" "$S/log/slurmd-$n.out" "-f $CONF -N $n " /usr/sbin/slurmd -D -f "$CONF" -N "$n"
    dev_wait_tcp 127.0.0.1 "$port" 20 "$pf" "$log"
    dev_log "$n: slurmd started on 127.0.0.1:$port (pid $DEV_PID, $(dev_ms_since "$t0") ms)"
}

# Job steps (slurmstepd) of node N, and everything below them. A slurmstepd
# keeps its node's log file (SlurmdLogFile with %n) open: that names the node.
stepd_tree_pids() {
    local n=$1 f pid roots=() all fd
    for f in $(grep -lsaE '^slurmstepd: \[' /proc/[0-9]*/cmdline 2>/dev/null); do
        pid=${f#/proc/}; pid=${pid%/cmdline}
        for fd in /proc/"$pid"/fd/*; do
            if [ "$(readlink "$fd" 2>/dev/null)" = "$S/log/slurmd-$n.log" ]; then
                roots+=("$pid"); break
            fi
        done
    done
    [ ${#roots[@]} -gt 0 ] || return 0
    # Descendants by ppid (one ps call).
    all=$(ps -e -o pid= -o ppid=)
    local frontier=("${roots[@]}") next seen=" ${roots[*]} "
    printf '%s\n' "${roots[@]}"
    while [ ${#frontier[@]} -gt 0 ]; do
        next=()
        for pid in "${frontier[@]}"; do
            while read -r c p; do
                if [ "$p" = "$pid" ] && [[ "$seen" != *" $c "* ]]; then
                    next+=("$c"); seen+="$c "; echo "$c"
                fi
            done <<<"$all"
        done
        frontier=("${next[@]+"${next[@]}"}")
    done
}

kill_steps() {
    local n=$1 pids
    pids=$(stepd_tree_pids "$n" | tr '\n' ' ')
    if [ -n "${pids// /}" ]; then
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        dev_log "$n: killed job step processes $pids"
    fi
}

stop_slurmd() { # NODE [KILL]
    local n=$1
    if [ "${2:-}" = KILL ]; then
        dev_log "$n: slurmd $(dev_kill "$(pidf "slurmd-$n")")"
        kill_steps "$n"
    else
        dev_log "$n: slurmd $(dev_stop "$(pidf "slurmd-$n")" 3)"
        kill_steps "$n"
    fi
}

node_state() { sinfo -h -N -n "$1" -o '%T' 2>/dev/null | head -n1; }

wait_nodes_ready() { # NODE... ; ready = idle/mixed/allocated, not "*"/down
    local n deadline st
    deadline=$(( $(date +%s) + ${DEV_READY_TIMEOUT:-40} ))
    for n in "$@"; do
        while :; do
            st=$(node_state "$n")
            case $st in idle|mixed|allocated|completing) break ;; esac
            [ "$(date +%s)" -ge "$deadline" ] && dev_die "$n: not ready (state '$st'); see $S/log/slurmd-$n.log"
            sleep 0.2
        done
    done
}

write_cluster_json() {
    local n first=1 pid
    {
        printf '{\n  "cluster_name": %s,\n  "conf": %s,\n  "env_file": %s,\n  "env": {"SLURM_CONF": %s},\n' \
            "$(dev_json_str "$CLUSTER")" "$(dev_json_str "$CONF")" \
            "$(dev_json_str "$S/env.sh")" "$(dev_json_str "$CONF")"
        printf '  "controller": {"host": %s, "addr": "127.0.0.1", "port": %s, "pid": %s},\n' \
            "$(dev_json_str "$HOST")" "$CTLD_PORT" "$(dev_pid "$(pidf slurmctld)" || echo null)"
        printf '  "accounting": {"slurmdbd_port": %s, "slurmdbd_pid": %s, "mariadb_port": %s, "mariadb_socket": %s, "mariadb_pid": %s},\n' \
            "$DBD_PORT" "$(dev_pid "$(pidf slurmdbd)" || echo null)" "$DB_PORT" \
            "$(dev_json_str "$DB_SOCK")" "$(dev_pid "$(pidf mariadbd)" || echo null)"
        printf '  "munge": {"socket": %s, "pid": %s},\n' \
            "$(dev_json_str "$MUNGE_SOCK")" "$(dev_pid "$(pidf munged)" || echo null)"
        printf '  "partitions": [\n    {"name": "debug", "default": true, "nodes": %s, "max_time": "01:00:00"},\n    {"name": "short", "default": false, "nodes": %s, "max_time": "00:05:00"}\n  ],\n' \
            "$(dev_json_str "n[1-$NUM_NODES]")" "$(dev_json_str "n[1-$NUM_NODES]")"
        printf '  "log_dir": %s,\n  "nodes": [' "$(dev_json_str "$S/log")"
        for n in "${NODES[@]}"; do
            pid=$(dev_pid "$(pidf "slurmd-$n")" || echo null)
            [ $first = 1 ] || printf ','
            first=0
            printf '\n    {"name": %s, "addr": "127.0.0.1", "port": %s, "cpus": %s, "real_memory": %s, "pid": %s, "log": %s}' \
                "$(dev_json_str "$n")" "$(node_port "$n")" "${NODE_CPUS:-null}" "${NODE_MEMORY:-null}" \
                "$pid" "$(dev_json_str "$S/log/slurmd-$n.log")"
        done
        printf '\n  ]\n}\n'
    } | dev_atomic_write "$S/cluster.json"
}

node_hw_from_conf() { # fill NODE_CPUS / NODE_MEMORY from the written slurm.conf
    [ -f "$CONF" ] || return 0
    NODE_CPUS=$(grep -o '^NodeName=.* CPUs=[0-9]*' "$CONF" | grep -o 'CPUs=[0-9]*' | cut -d= -f2)
    NODE_MEMORY=$(grep -o '^NodeName=.* RealMemory=[0-9]*' "$CONF" | grep -o 'RealMemory=[0-9]*' | cut -d= -f2)
}

# ---------------------------------------------------------------- commands

cmd_up() {
    dev_need_root
    dev_apt_install "${PACKAGES[@]}"
    write_configs
    ensure_hosts
    # A changed slurm.conf needs restarted daemons (reconfigure does not
    # apply SchedulerParameters, ports or nodes).
    if [ "$CONF_CHANGED" = 1 ] && dev_running "$(pidf slurmctld)"; then
        dev_log "slurm.conf changed: restarting slurmctld and the slurmd daemons"
        local n
        for n in "${NODES[@]}"; do stop_slurmd "$n"; done
        dev_log "slurmctld: $(dev_stop "$(pidf slurmctld)" 10)"
    fi
    if [ "$DBD_CONF_CHANGED" = 1 ] && dev_running "$(pidf slurmdbd)"; then
        dev_log "slurmdbd.conf changed: restarting slurmdbd"
        dev_log "slurmdbd: $(dev_stop "$(pidf slurmdbd)" 10)"
    fi
    start_munge
    start_mariadb
    start_slurmdbd
    register_cluster
    start_slurmctld
    local n t0
    for n in "${NODES[@]}"; do start_slurmd "$n"; done
    t0=$(date +%s%N)
    wait_nodes_ready "${NODES[@]}"
    dev_log "nodes ${NODES[*]} ready in $(dev_ms_since "$t0") ms"
    write_cluster_json
    dev_log "up: cluster $CLUSTER; source $S/env.sh (SLURM_CONF=$CONF); description in $S/cluster.json"
}

cmd_down() {
    local n
    if dev_running "$(pidf slurmctld)"; then
        local jobs
        jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ' || true)
        if [ -n "${jobs// /}" ]; then
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            dev_log "cancelled jobs $jobs"
            # Let the steps end normally (a slurmd with live steps is slow to stop).
            for _ in $(seq 1 50); do
                [ -z "$(squeue -h -t running,completing -o %A 2>/dev/null)" ] && break
                sleep 0.2
            done
        fi
    fi
    # slurmctld first: stopped after the slurmd daemons it spends seconds on
    # pings to them (MessageTimeout) before it exits.
    dev_log "slurmctld: $(dev_stop "$(pidf slurmctld)" 10)"
    for n in "${NODES[@]}"; do
        if [ -f "$(pidf "slurmd-$n")" ] || [ -n "$(stepd_tree_pids "$n")" ]; then stop_slurmd "$n"; fi
    done
    dev_log "slurmdbd: $(dev_stop "$(pidf slurmdbd)" 10)"
    dev_log "mariadb: $(dev_stop "$(pidf mariadbd)" 30)"
    dev_log "munged: $(dev_stop "$(pidf munged)" 10)"
    rm -f "$S/cluster.json"   # none while down
    dev_log "down: done"
}

cmd_status() {
    local rc=0 d
    for d in munged mariadbd slurmdbd slurmctld; do
        if dev_running "$(pidf "$d")"; then dev_log "$d: running (pid $DEV_PID)"
        else dev_log "$d: not running"; rc=1; fi
    done
    for d in "${NODES[@]}"; do
        if dev_running "$(pidf "slurmd-$d")"; then dev_log "$d: slurmd running (pid $DEV_PID, port $(node_port "$d"))"
        else dev_log "$d: slurmd not running"; rc=1; fi
    done
    if dev_running "$(pidf slurmctld)"; then sinfo -N -o '%N %P %T %c %m' 2>/dev/null || true; fi
    return $rc
}

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in status|help|-h|"") ;; *) dev_lock slurm ;; esac
    case $cmd in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        kill-node)
            check_node_name "${1:-}"
            stop_slurmd "$1" KILL
            node_hw_from_conf; [ -f "$S/cluster.json" ] && write_cluster_json
            dev_log "$1: slurmd gone; slurmctld marks it DOWN (jobs on it NODE_FAIL) in ~15-20 s" ;;
        revive-node)
            check_node_name "${1:-}"
            dev_running "$(pidf slurmctld)" || dev_die "slurmctld is not running; run: $0 up"
            start_slurmd "$1"
            local t0
            t0=$(date +%s%N)
            # A node marked DOWN while its slurmd was away returns by itself
            # (ReturnToService=2); RESUME covers one drained by hand.
            case $(node_state "$1") in
                drain*|down) scontrol update NodeName="$1" State=RESUME 2>/dev/null || true ;;
            esac
            wait_nodes_ready "$1"
            node_hw_from_conf; [ -f "$S/cluster.json" ] && write_cluster_json
            dev_log "$1: back in service in $(dev_ms_since "$t0") ms" ;;
        purge)
            cmd_down
            rm -rf "$S/state" "$S/spool" "$S/log" "$DB_DIR/data" "$S/cluster.json"
            dev_log "purge: removed state, spool, logs and the accounting database" ;;
        *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; [ -z "$cmd" ] || [ "$cmd" = help ] || [ "$cmd" = -h ] || exit 2 ;;
    esac
}

main "$@"
