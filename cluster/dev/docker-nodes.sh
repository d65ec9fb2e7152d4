#!/usr/bin/env bash
# Emulated Docker nodes for development and tests, on this one machine:
# a loopback registry and one dockerd per node (n1..nN), each with its own
# data root, exec root, socket and cgroup parent; no bridge, no iptables;
# a loopback stand-in for astral.sh's uv installer (rl360cli/egress/uv_standin.py),
# which cluster/dev-docker.toml's [egress.mirrors] serves for https://astral.sh/uv/; and one for
# uv's managed-Python downloads (rl360cli/egress/python_standin.py: this machine's CPython 3.13),
# served for https://github.com/astral-sh/python-build-standalone/releases/download/.
#
#   docker-nodes.sh up [N=4]      install if missing, start, build/push base images (N=4: one per dev Slurm node)
#   docker-nodes.sh down          stop what this script started (by pid file)
#   docker-nodes.sh status        one line per daemon
#   docker-nodes.sh images        (re)build the base images, push, drop from caches
#   docker-nodes.sh standins      (re)build the stand-ins only (hub/, ghcr/), push
#   docker-nodes.sh cold          remove the base images from every node's cache
#   docker-nodes.sh stop-node nX  stop one dockerd (TERM; containers stop)
#   docker-nodes.sh kill-node nX  SIGKILL one dockerd (a crash; running containers die when it restarts)
#   docker-nodes.sh start-node nX start one dockerd again
#   docker-nodes.sh purge         down, then delete node data and the registry data
#
# Writes $DEV_ROOT/docker/nodes.json (see docs/dev-cluster.md).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEV_LOG_PREFIX=docker-nodes
# shellcheck source=lib.sh
source "$HERE/lib.sh"

dev_settings "$DEV_ROOT/docker/settings.env" RL360_DEV_REGISTRY_PORT=5000 RL360_DEV_UV_STANDIN_PORT=5081 \
    RL360_DEV_PYTHON_STANDIN_PORT=5082
REG_PORT=$RL360_DEV_REGISTRY_PORT
REG_ADDR=127.0.0.1:$REG_PORT
REG_DIR=$DEV_ROOT/registry
REG_REG_DATA=$REG_DIR/data
DOCKER_DIR=$DEV_ROOT/docker
DOCKER_CLI=${RL360_DEV_DOCKER_CLI:-$(command -v docker || echo /usr/local/bin/docker)}
BUSYBOX_REF=$REG_ADDR/rl360/busybox:latest
PYTHON_REF=$REG_ADDR/rl360/python:3.11
# Stand-ins for the Docker Hub bases Harbor tasks start FROM, under the registry's hub/ (the mirror that
# cluster/dev-docker.toml names for docker.io): images/standin/Dockerfile says what they are and are not.
STANDINS=(ubuntu:24.04 python:3.12-slim python:3.11-slim)
# The python:* stand-ins get pip (its wheel), and ghcr.io/astral-sh/uv:latest's stand-in, under the registry's
# ghcr/ (the mirror cluster/dev-docker.toml names for ghcr.io), holds /uv and /uvx of uv's wheel
# (images/standin-uv/Dockerfile). Wheels come from /opt/wheels when there, else from PyPI.
PIP_VERSION=24.3.1
UV_VERSION=0.9.7
UV_STANDIN_REF=$REG_ADDR/ghcr/astral-sh/uv:latest
SUITE=bookworm
PY_INCLUDE=python3-minimal,python3-pytest
PACKAGES=(docker.io docker-registry busybox-static debootstrap)
# The uv installer's stand-in: cluster/dev-docker.toml's mirror names this port (change both together).
UV_PORT=$RL360_DEV_UV_STANDIN_PORT
UV_VERSION=0.9.7   # harbor-cookbook's verifiers ask for this one
UV_DIR=$DEV_ROOT/uv-standin
# The managed-Python downloads' stand-in: cluster/dev-docker.toml's github.com mirror names this port. The uv
# installer's stand-in has each sandbox fetch its list (by that mirror) and name it in uv's env file.
PY_PORT=$RL360_DEV_PYTHON_STANDIN_PORT
PY_DIR=$DEV_ROOT/python-standin
PY_LIST=https://github.com/astral-sh/python-build-standalone/releases/download/rl360-stand-in/python-downloads.json
REPO_ROOT=$(cd "$HERE/../.." && pwd)

# Containers of node nX live in cgroup /rl360-nX (absolute); another
# DEV_ROOT gets its own prefix so that two sets of nodes never share one.
if [ "$DEV_ROOT" = /tmp/rl360-dev ]; then CG_PREFIX=rl360
else CG_PREFIX=rl360-$(printf '%s' "$DEV_ROOT" | sha256sum | cut -c1-8); fi
node_cgroup() { echo "/$CG_PREFIX-$1"; }
node_dir() { echo "$DOCKER_DIR/$1"; }
node_sock() { echo "$DOCKER_DIR/$1/docker.sock"; }
node_pidfile() { echo "$DOCKER_DIR/$1/rl360.pid"; }
dk() { local n=$1; shift; "$DOCKER_CLI" -H "unix://$(node_sock "$n")" "$@"; }
# dk_within SECONDS NODE ARGS...: a docker call that may not hang the script (a daemon that stopped answering).
dk_within() { local secs=$1; shift; timeout "$secs" "$DOCKER_CLI" -H "unix://$(node_sock "$1")" "${@:2}"; }

check_node_name() {
    [[ "${1:-}" =~ ^n[0-9]+$ ]] || dev_die "node name must be nX (got '${1:-}')"
}

# Nodes that have a directory (started at least once), sorted n1 n2 ... n10.
known_nodes() {
    local d
    for d in "$DOCKER_DIR"/n[0-9]*; do
        [ -d "$d" ] && basename "$d"
    done | sort -V
}

# ---------------------------------------------------------------- registry

start_registry() {
    local cfg=$REG_DIR/config.yml pidfile=$REG_DIR/rl360.pid log=$REG_DIR/registry.log
    mkdir -p "$REG_REG_DATA"
    local changed=0
    dev_write_if_changed "$cfg" <<EOF && changed=1
# Written by cluster/dev/docker-nodes.sh. Loopback only, no auth.
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $REG_DIR/data
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: $REG_ADDR
health:
  storagedriver:
    enabled: false
EOF
    if dev_running "$pidfile"; then
        if [ $changed = 0 ]; then
            dev_log "registry: already running on $REG_ADDR (pid $DEV_PID)"
            return
        fi
        dev_log "registry: config changed; $(dev_stop "$pidfile" 10)"
    fi
    seed_registry
    dev_port_free 127.0.0.1 "$REG_PORT" \
        || dev_die "127.0.0.1:$REG_PORT is taken by another process; set RL360_DEV_REGISTRY_PORT"
    dev_start "$pidfile" "$log" "$cfg" /usr/bin/docker-registry serve "$cfg"
    dev_wait_tcp 127.0.0.1 "$REG_PORT" 20 "$pidfile" "$log"
    dev_log "registry: started on $REG_ADDR (pid $DEV_PID, storage $REG_DIR/data)"
}

registry_has() { # REF -> manifest present
    local ref=$1 repo tag
    repo=${ref#"$REG_ADDR"/}; tag=${repo##*:}; repo=${repo%:*}
    curl --noproxy '*' -fsS -o /dev/null -m 5 \
        -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
        "http://$REG_ADDR/v2/$repo/manifests/$tag" 2>/dev/null
}

# ---------------------------------------------------------------- uv installer stand-in

uv_wheel() { # PYTHON -> path of PyPI's uv wheel: /opt/wheels', else the cache's, else downloaded once; 1 if none
    local w
    w=$(ls /opt/wheels/uv-"$UV_VERSION"-*manylinux*x86_64*.whl 2>/dev/null | head -n1 || true)
    [ -n "$w" ] || w=$(ls "$DEV_CACHE"/wheels/uv-"$UV_VERSION"-*manylinux*x86_64*.whl 2>/dev/null | head -n1 || true)
    if [ -z "$w" ]; then
        mkdir -p "$DEV_CACHE/wheels"
        "$1" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
            --platform manylinux2014_x86_64 -d "$DEV_CACHE/wheels" "uv==$UV_VERSION" >&2 || return 1
        w=$(ls "$DEV_CACHE"/wheels/uv-"$UV_VERSION"-*manylinux*x86_64*.whl | head -n1)
    fi
    echo "$w"
}

start_uv_standin() {
    local pidfile=$UV_DIR/rl360.pid log=$UV_DIR/uv-standin.log py wheel
    mkdir -p "$UV_DIR"
    if dev_running "$pidfile"; then
        dev_log "uv stand-in: already running on 127.0.0.1:$UV_PORT (pid $DEV_PID)"
        return
    fi
    # The real interpreter, not a shim (dev_start records the process it execs into); stdlib only.
    py=$(python3 -c 'import sys; print(sys.executable)')
    # Not fatal: without it only the tasks whose verifiers fetch astral.sh's installer fail (their line says so).
    wheel=$(uv_wheel "$py") || {
        dev_log "uv stand-in: NOT started: no uv==$UV_VERSION wheel (PyPI unreachable? put it in /opt/wheels)"
        return 0
    }
    dev_port_free 127.0.0.1 "$UV_PORT" \
        || dev_die "127.0.0.1:$UV_PORT is taken by another process; set RL360_DEV_UV_STANDIN_PORT (and the mirror in cluster/dev-docker.toml)"
    dev_start "$pidfile" "$log" "rl360cli.egress.uv_standin --port $UV_PORT" \
        env PYTHONPATH="$REPO_ROOT" "$py" -m rl360cli.egress.uv_standin --port "$UV_PORT" --wheel "$wheel" \
        --python-downloads "$PY_LIST"
    dev_wait_tcp 127.0.0.1 "$UV_PORT" 30 "$pidfile" "$log"
    dev_log "uv stand-in: started on 127.0.0.1:$UV_PORT (pid $DEV_PID, uv from $wheel)"
}

start_python_standin() {
    local pidfile=$PY_DIR/rl360.pid log=$PY_DIR/python-standin.log py home
    mkdir -p "$PY_DIR"
    if dev_running "$pidfile"; then
        dev_log "python stand-in: already running on 127.0.0.1:$PY_PORT (pid $DEV_PID)"
        return
    fi
    py=$(python3 -c 'import sys; print(sys.executable)')
    # This machine's CPython 3.13 (pyenv's, as the TB2 bench's stand-in bases take it). Not fatal: without it
    # only a `uvx -p 3.13` on an image without 3.13 fails (uv asks github.com, which the proxy refuses).
    home=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13.* 2>/dev/null | sort -V | tail -n1 || true)
    if [ -z "$home" ] || [ ! -x "$home/bin/python3.13" ]; then
        dev_log "python stand-in: NOT started: no CPython 3.13 under ${PYENV_ROOT:-$HOME/.pyenv}/versions"
        return 0
    fi
    dev_port_free 127.0.0.1 "$PY_PORT" \
        || dev_die "127.0.0.1:$PY_PORT is taken by another process; set RL360_DEV_PYTHON_STANDIN_PORT (and the mirror in cluster/dev-docker.toml)"
    dev_start "$pidfile" "$log" "rl360cli.egress.python_standin --port $PY_PORT" \
        env PYTHONPATH="$REPO_ROOT" "$py" -m rl360cli.egress.python_standin --port "$PY_PORT" --python "$home"
    dev_wait_tcp 127.0.0.1 "$PY_PORT" 60 "$pidfile" "$log"
    dev_log "python stand-in: started on 127.0.0.1:$PY_PORT (pid $DEV_PID, CPython from $home)"
}

# ---------------------------------------------------------------- nodes

# The dockerd command line of node N (in DOCKERD_ARGS).
node_args() {
    local n=$1 d
    d=$(node_dir "$n")
    DOCKERD_ARGS=(
        /usr/sbin/dockerd
        --config-file "$d/daemon.json"
        --data-root "$d/data"
        --exec-root "$d/exec"
        --pidfile "$d/docker.pid"
        --host "unix://$(node_sock "$n")"
        --storage-driver overlay2
        --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false
        --bridge=none
        # Absolute: a relative parent nests under dockerd's own cgroup, which
        # is whatever cgroup the shell that ran "up" was in.
        --cgroup-parent "$(node_cgroup "$n")"
        --exec-opt native.cgroupdriver=cgroupfs
        --shutdown-timeout 3
        --log-level warn
    )
}

start_node() {
    local n=$1 d pidfile log sock
    d=$(node_dir "$n"); pidfile=$(node_pidfile "$n"); log=$d/dockerd.log; sock=$(node_sock "$n")
    node_args "$n"
    if dev_running "$pidfile"; then
        if [ "$(dev_proc_cmdline "$DEV_PID")" = "${DOCKERD_ARGS[*]} " ]; then
            dev_log "$n: dockerd already running (pid $DEV_PID)"
            return
        fi
        dev_log "$n: dockerd runs with other flags; restarting it"
        stop_node "$n"
    fi
    mkdir -p "$d/data" "$d/exec"
    # Our own (empty) daemon.json so /etc/docker/daemon.json never applies.
    [ -f "$d/daemon.json" ] || echo '{}' >"$d/daemon.json"
    rm -f "$sock"
    # A dockerd killed by SIGKILL leaves its pid file; dockerd refuses to start
    # when that pid is alive, and the pid may have been reused.
    rm -f "$d/docker.pid"
    # Same for its managed containerd: after a SIGKILL the old containerd is a
    # zombie for a while (PID 1 reaps slowly) and dockerd, seeing that pid
    # "alive", waits for its socket and gives up after 10 s.
    local cpf=$d/exec/containerd/containerd.pid cpid
    if [ -f "$cpf" ]; then
        cpid=$(cat "$cpf" 2>/dev/null || true)
        if [ -z "$cpid" ] || [ "$(dev_proc_state "$cpid" 2>/dev/null)" = Z ] \
            || [[ "$(dev_proc_cmdline "$cpid")" != *"$d/exec/containerd"* ]]; then
            rm -f "$cpf"
        fi
    fi
    local t0
    t0=$(date +%s%N)
    dev_start "$pidfile" "$log" "--host unix://$sock" "${DOCKERD_ARGS[@]}"
    local pid=$DEV_PID
    DEV_WAIT_TIMEOUT=30 DEV_WAIT_PIDFILE=$pidfile dev_wait \
        curl --noproxy '*' -fsS -m 2 --unix-socket "$sock" http://d/_ping || {
        tail -n 20 "$log" >&2
        dev_die "$n: dockerd did not answer on $sock (log $log)"
    }
    dev_log "$n: dockerd started (pid $pid, $sock, $(dev_ms_since "$t0") ms)"
}

stop_node() { # NODE [GRACE] [SIGNAL]
    local n=$1 d r ids
    d=$(node_dir "$n")
    if [ "${3:-TERM}" = TERM ] && dev_running "$(node_pidfile "$n")"; then
        # dockerd stops running containers one by one with each one's stop
        # timeout (10 s default, --shutdown-timeout does not cap it): kill
        # them first so that a stop takes ~1 s.
        # A paused container is thawed first: `docker kill` of a frozen one can hang for good (cgroup v1).
        ids=$(dk_within 30 "$n" ps -q --filter status=paused 2>/dev/null || true)
        # shellcheck disable=SC2086
        [ -z "$ids" ] || dk_within 30 "$n" unpause $ids >/dev/null 2>&1 || true
        ids=$(dk_within 30 "$n" ps -q 2>/dev/null || true)
        if [ -n "$ids" ]; then
            # Bounded all the same (a container frozen after the look above, or a daemon that stopped
            # answering): the daemon's own stop below, then the cgroup sweep, end what is left.
            # shellcheck disable=SC2086
            dk_within 60 "$n" kill $ids >/dev/null 2>&1 || true
            dev_log "$n: killed $(echo $ids | wc -w) running container(s)"
        fi
    fi
    r=$(dev_stop "$(node_pidfile "$n")" "${2:-20}" "${3:-TERM}")
    dev_log "$n: dockerd $r"
    if [ "${3:-TERM}" = TERM ]; then
        # Containers a SIGKILLed dockerd left running: every process in this
        # node's own container cgroups.
        local cgdir procs
        for cgdir in "/sys/fs/cgroup/pids$(node_cgroup "$n")" "/sys/fs/cgroup$(node_cgroup "$n")"; do
            [ -d "$cgdir" ] || continue
            procs=$(find "$cgdir" -mindepth 2 -name cgroup.procs -exec cat {} + 2>/dev/null | tr '\n' ' ')
            if [ -n "${procs// /}" ]; then
                # shellcheck disable=SC2086
                kill -KILL $procs 2>/dev/null || true
                dev_log "$n: killed leftover container processes $procs"
            fi
        done
        # A dockerd that was SIGKILLed earlier leaves its managed containerd
        # (and shims) behind; they carry our exec root in their command line.
        local pid left=()
        for pid in $(dev_pids_matching "$d/exec/containerd"); do
            left+=("$pid")
        done
        if [ ${#left[@]} -gt 0 ]; then
            kill -TERM "${left[@]}" 2>/dev/null || true
            sleep 1
            for pid in "${left[@]}"; do
                [ -d "/proc/$pid" ] && [ "$(dev_proc_state "$pid")" != Z ] \
                    && [[ "$(dev_proc_cmdline "$pid")" == *"$d/exec/containerd"* ]] \
                    && kill -KILL "$pid" 2>/dev/null || true
            done
            dev_log "$n: stopped ${#left[@]} leftover containerd process(es) of $n"
        fi
        # dockerd bind-mounts its data root onto itself (private propagation)
        # and leaves it mounted after a SIGKILL; drop such leftovers.
        if grep -qF " $d/" /proc/self/mountinfo; then
            dev_umount_under "$d"
            dev_log "$n: unmounted leftover mounts under $d"
        fi
    fi
}

# ---------------------------------------------------------------- images

debian_mirror() {
    if [ -n "${RL360_DEV_DEBIAN_MIRROR:-}" ]; then echo "$RL360_DEV_DEBIAN_MIRROR"; return; fi
    local m
    m=$(apt-cache policy 2>/dev/null | awk -v s="$SUITE/main" '$3 == s && $1 ~ /^[0-9]+$/ {print $2; exit}')
    if [ -z "$m" ]; then
        m=$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/* \
            | grep -v security | grep -Eo 'https?://[^ ]*debian/?' | head -n1)
    fi
    echo "${m:-http://deb.debian.org/debian}"
}

build_busybox_tar() { # -> path of the rootfs tarball
    local out=$DEV_ROOT/build/busybox-rootfs.tar root=$DEV_ROOT/build/busybox-rootfs
    rm -rf "$root"; mkdir -p "$root"/{bin,etc,tmp,root,proc,sys,dev,var,home,usr/bin,usr/sbin,sbin}
    cp /bin/busybox "$root/bin/busybox"
    chroot "$root" /bin/busybox --install -s /bin
    chmod 1777 "$root/tmp"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    tar -C "$root" --numeric-owner -cf "$out" .
    rm -rf "$root"
    echo "$out"
}

build_python_tar() { # -> path of the (cached) rootfs tarball
    local key out root mirror t0
    key=$(printf '%s %s %s' "$SUITE" minbase "$PY_INCLUDE" | sha256sum | cut -c1-12)
    out=$DEV_CACHE/debootstrap-$SUITE-minbase-python-$key.tar
    if [ -s "$out" ]; then
        dev_log "python image: rootfs from cache $out" >&2
        echo "$out"; return
    fi
    mkdir -p "$DEV_CACHE/debs"
    mirror=$(debian_mirror)
    root=$DEV_ROOT/build/python-rootfs
    rm -rf "$root"; mkdir -p "$root"
    t0=$(date +%s%N)
    dev_log "python image: debootstrap --variant=minbase --include=$PY_INCLUDE $SUITE from $mirror (~30-60 s)" >&2
    debootstrap --variant=minbase --include="$PY_INCLUDE" --cache-dir="$DEV_CACHE/debs" \
        "$SUITE" "$root" "$mirror" >"$DEV_ROOT/build/debootstrap.log" 2>&1 || {
        tail -n 20 "$DEV_ROOT/build/debootstrap.log" >&2
        dev_die "debootstrap failed (log $DEV_ROOT/build/debootstrap.log)"
    }
    # Slim it: no package downloads, no apt lists, no docs.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/* \
        "$root"/var/log/*.log "$root"/var/cache/debconf/*-old
    tar -C "$root" --numeric-owner -cf "$out.tmp" .
    mv -f "$out.tmp" "$out"
    rm -rf "$root"
    dev_log "python image: rootfs built in $(dev_ms_since "$t0") ms, cached at $out ($(du -m "$out" | cut -f1) MB)" >&2
    echo "$out"
}

import_push() { # NAME REF TARBALL CMD CHECK...
    local name=$1 ref=$2 tarball=$3 cmd=$4 t0
    shift 4
    t0=$(date +%s%N)
    dk n1 import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change "CMD $cmd" \
        "$tarball" "$ref" >/dev/null
    # A smoke test before publishing (runs on n1, which has it now).
    dk n1 run --rm --network none "$ref" "$@" >/dev/null \
        || dev_die "$name image: smoke test '$*' failed"
    dk n1 push "$ref" >/dev/null
    dk n1 rmi "$ref" >/dev/null
    dev_log "$name image: imported, tested, pushed to $ref and removed from n1 in $(dev_ms_since "$t0") ms"
}

# python312_home -> the prefix of a CPython 3.12 built on this machine (RL360_DEV_PYTHON312, else pyenv's),
# which python:3.12-slim's stand-in gets (images/standin/Dockerfile); fails when there is none.
python312_home() {
    local home=${RL360_DEV_PYTHON312:-}
    [ -n "$home" ] || home=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.* 2>/dev/null | sort -V | tail -n1)
    [ -n "$home" ] && [ -x "$home/bin/python3.12" ] && echo "$home"
}

# wheel_of NAME VERSION TAG -> the path of NAME==VERSION's wheel whose file name holds TAG: /opt/wheels's,
# else one fetched from PyPI once (its simple API, as JSON, names the files) into $DEV_CACHE/wheels.
wheel_of() {
    local name=$1 version=$2 tag=$3 found dir=$DEV_CACHE/wheels url
    found=$(ls /opt/wheels/"$name-$version"-*"$tag"*.whl "$dir/$name-$version"-*"$tag"*.whl 2>/dev/null | head -n1 || true)
    if [ -z "$found" ]; then
        mkdir -p "$dir"
        url=$(curl -fsSL --retry 3 -H 'Accept: application/vnd.pypi.simple.v1+json' \
            "https://pypi.org/simple/$name/" | python3 -c '
import json, sys
name, version, tag = sys.argv[1:]
prefix = f"{name}-{version}-"
print(next(f["url"] for f in json.load(sys.stdin)["files"]
           if f["filename"].startswith(prefix) and f["filename"].endswith(".whl") and tag in f["filename"]))
' "$name" "$version" "$tag" 2>/dev/null) || dev_die "wheel $name==$version ($tag): not found on PyPI"
        found=$dir/${url##*/}
        curl -fsSL --retry 3 -o "$found.tmp" "$url" && mv -f "$found.tmp" "$found" \
            || dev_die "wheel $name==$version: download from $url failed"
    fi
    echo "$found"
}

# ensure_images [force]: make the registry hold both base images.
# The registry's storage right after the base images were pushed, cached so
# that a fresh DEV_ROOT gets them in a second instead of an import + push.
registry_snapshot() {
    local key
    key=$(printf '%s %s %s %s' "$SUITE" "$PY_INCLUDE" \
        "$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null)" "$REG_REPO_VERSION" \
        | sha256sum | cut -c1-12)
    echo "$DEV_CACHE/registry-base-images-$key.tar"
}
REG_REPO_VERSION=3   # bump when the image recipes below change

# ensure_images [force|standins]: make the registry hold the base images and the stand-ins (force:
# rebuild all; standins: rebuild the stand-ins only).
ensure_images() {
    local force=${1:-} built=0 snap
    mkdir -p "$DEV_ROOT/build" "$DEV_CACHE"
    snap=$(registry_snapshot)
    if { [ -z "$force" ] || [ "$force" = standins ]; } && registry_has "$BUSYBOX_REF"; then
        dev_log "busybox image: present in registry ($BUSYBOX_REF)"
    else
        local tb t0
        t0=$(date +%s%N)
        tb=$(build_busybox_tar)
        dev_log "busybox image: rootfs built in $(dev_ms_since "$t0") ms"
        import_push busybox "$BUSYBOX_REF" "$tb" '["sh"]' sh -c 'echo ok'
        rm -f "$tb"
        built=1
    fi
    if { [ -z "$force" ] || [ "$force" = standins ]; } && registry_has "$PYTHON_REF"; then
        dev_log "python image: present in registry ($PYTHON_REF)"
    else
        local tb
        tb=$(build_python_tar)
        import_push python "$PYTHON_REF" "$tb" '["/bin/bash"]' \
            bash -c 'python3 -m pytest --version && python3 -c "import sys; assert sys.version_info[:2] == (3, 11)"'
        built=1
    fi
    local base ref ctx t0 with_pip wheel note py312
    for base in "${STANDINS[@]}"; do
        ref=$REG_ADDR/hub/library/$base
        if [ -z "$force" ] && registry_has "$ref"; then
            dev_log "stand-in $base: present in registry ($ref)"
            continue
        fi
        t0=$(date +%s%N)
        ctx=$DEV_ROOT/build/standin
        rm -rf "$ctx"; mkdir -p "$ctx/extra"
        cp "$HERE/../../images/standin/Dockerfile" "$ctx/"
        with_pip= note=
        # What this machine added to its trust store (its way out may re-sign TLS): images/standin/Dockerfile.
        if [ -n "$(ls /usr/local/share/ca-certificates/*.crt 2>/dev/null)" ] && [ -s /etc/ssl/certs/ca-certificates.crt ]; then
            mkdir -p "$ctx/extra/local-ca"
            cp /usr/local/share/ca-certificates/*.crt "$ctx/extra/local-ca/"
            cp /etc/ssl/certs/ca-certificates.crt "$ctx/extra/"
        fi
        case $base in python:*)
            with_pip=1
            wheel=$(wheel_of pip "$PIP_VERSION" py3-none-any) || exit 1
            cp "$wheel" "$ctx/extra/" ;;
        esac
        if [ "$base" = python:3.12-slim ] && py312=$(python312_home); then
            tar -C "$py312" -cf "$ctx/extra/python3.12.tar" --exclude=lib/python3.12/test \
                --exclude=lib/python3.12/idlelib --exclude='lib/python3.12/config-*' \
                --exclude=lib/python3.12/site-packages bin/python3.12 lib
            note=", and CPython $("$py312/bin/python3.12" -c 'import platform; print(platform.python_version())') as python3"
        fi
        dk n1 build -q --force-rm --network none --build-arg "BASE=$PYTHON_REF" --build-arg "STANDS_FOR=$base" \
            --build-arg "WITH_PIP=$with_pip" --build-arg "PYTHON_NOTE=$note" -t "$ref" "$ctx" >"$ctx.log" 2>&1 \
            || { tail -n 20 "$ctx.log" >&2; dev_die "stand-in $base: build failed (log $ctx.log)"; }
        dk n1 push "$ref" >/dev/null
        dk n1 rmi "$ref" >/dev/null
        dev_log "stand-in $base: built on $PYTHON_REF, pushed to $ref in $(dev_ms_since "$t0") ms"
        built=1
    done
    if [ -z "$force" ] && registry_has "$UV_STANDIN_REF"; then
        dev_log "stand-in ghcr.io/astral-sh/uv:latest: present in registry ($UV_STANDIN_REF)"
    else
        t0=$(date +%s%N)
        ctx=$DEV_ROOT/build/standin-uv
        rm -rf "$ctx"; mkdir -p "$ctx"
        cp "$HERE/../../images/standin-uv/Dockerfile" "$ctx/"
        wheel=$(wheel_of uv "$UV_VERSION" manylinux_2_17_x86_64) || exit 1
        unzip -q -j -o "$wheel" \
            "uv-$UV_VERSION.data/scripts/uv" "uv-$UV_VERSION.data/scripts/uvx" -d "$ctx"
        dk n1 build -q --force-rm --network none --build-arg "UV_VERSION=$UV_VERSION" -t "$UV_STANDIN_REF" "$ctx" \
            >"$ctx.log" 2>&1 || { tail -n 20 "$ctx.log" >&2; dev_die "stand-in uv: build failed (log $ctx.log)"; }
        dk n1 push "$UV_STANDIN_REF" >/dev/null
        dk n1 rmi "$UV_STANDIN_REF" >/dev/null
        dev_log "stand-in ghcr.io/astral-sh/uv:latest: uv $UV_VERSION's binaries, pushed to $UV_STANDIN_REF in $(dev_ms_since "$t0") ms"
        built=1
    fi
    if [ $built = 1 ] || [ ! -s "$snap" ]; then
        tar -C "$REG_REG_DATA" -cf "$snap.tmp" . && mv -f "$snap.tmp" "$snap"
        dev_log "registry: cached its storage at $snap ($(du -m "$snap" | cut -f1) MB)"
    fi
}

# A registry with empty storage is seeded from the cached snapshot.
seed_registry() {
    local snap
    snap=$(registry_snapshot)
    if [ -s "$snap" ] && [ -z "$(ls -A "$REG_REG_DATA" 2>/dev/null)" ]; then
        mkdir -p "$REG_REG_DATA"
        tar -C "$REG_REG_DATA" -xf "$snap"
        dev_log "registry: storage seeded from $snap"
    fi
}

# cold: no node has the base images cached (prewarm tests want cold nodes).
make_cold() {
    local n ref
    for n in $(known_nodes); do
        dev_running "$(node_pidfile "$n")" || continue
        for ref in "$BUSYBOX_REF" "$PYTHON_REF"; do
            if dk "$n" image inspect "$ref" >/dev/null 2>&1; then
                dk "$n" rmi -f "$ref" >/dev/null && dev_log "$n: removed $ref from cache"
            fi
        done
    done
}

# ---------------------------------------------------------------- nodes.json

write_nodes_json() {
    local n first=1 pid
    mkdir -p "$DOCKER_DIR"
    {
        printf '{\n  "registry": %s,\n' "$(dev_json_str "$REG_ADDR")"
        printf '  "registry_url": %s,\n' "$(dev_json_str "http://$REG_ADDR")"
        printf '  "images": {"busybox": %s, "python": %s},\n' \
            "$(dev_json_str "$BUSYBOX_REF")" "$(dev_json_str "$PYTHON_REF")"
        printf '  "docker_cli": %s,\n' "$(dev_json_str "$DOCKER_CLI")"
        printf '  "nodes": ['
        for n in "$@"; do
            pid=$(dev_pid "$(node_pidfile "$n")" || echo null)
            [ $first = 1 ] || printf ','
            first=0
            printf '\n    {"name": %s, "docker_host": %s, "data_root": %s, "exec_root": %s, "cgroup_parent": %s, "pid": %s, "log": %s}' \
                "$(dev_json_str "$n")" "$(dev_json_str "unix://$(node_sock "$n")")" \
                "$(dev_json_str "$(node_dir "$n")/data")" "$(dev_json_str "$(node_dir "$n")/exec")" \
                "$(dev_json_str "$(node_cgroup "$n")")" "$pid" "$(dev_json_str "$(node_dir "$n")/dockerd.log")"
        done
        printf '\n  ]\n}\n'
    } | dev_atomic_write "$DOCKER_DIR/nodes.json"
}

# Node list from nodes.json (what "up" asked for).
json_nodes() {
    [ -f "$DOCKER_DIR/nodes.json" ] || return 0
    grep -o '"name": "n[0-9]*"' "$DOCKER_DIR/nodes.json" | cut -d'"' -f4 | grep -x 'n[0-9][0-9]*' | awk '!seen[$0]++'
}

refresh_json() { # keep the node list, refresh pids
    local nodes
    nodes=$(json_nodes | tr '\n' ' ')
    [ -n "$nodes" ] || return 0
    # shellcheck disable=SC2086
    write_nodes_json $nodes
}

# ---------------------------------------------------------------- commands

cmd_up() {
    # 4 by default: each dev Slurm node nX (slurm.sh) has its own dockerd nX, where a profile's
    # `[sandbox] docker_host` naming {node} finds it (cluster/dev-slurm-docker.toml).
    local num=${1:-${RL360_DEV_DOCKER_NODES:-4}} i n nodes=()
    [[ "$num" =~ ^[1-9][0-9]*$ ]] || dev_die "up N: N must be a positive count (got '$num')"
    dev_need_root
    dev_apt_install "${PACKAGES[@]}"
    [ -x "$DOCKER_CLI" ] || dev_die "no docker CLI ($DOCKER_CLI); set RL360_DEV_DOCKER_CLI"
    mkdir -p "$DOCKER_DIR"
    start_registry
    start_uv_standin
    start_python_standin
    for i in $(seq 1 "$num"); do nodes+=("n$i"); done
    # Nodes beyond N that an earlier "up" started: stop them ("up N" is the
    # desired state).
    for n in $(known_nodes); do
        [ "${n#n}" -gt "$num" ] && dev_running "$(node_pidfile "$n")" && stop_node "$n"
    done
    for n in "${nodes[@]}"; do start_node "$n"; done
    ensure_images
    write_nodes_json "${nodes[@]}"
    dev_log "up: ${#nodes[@]} node(s), registry $REG_ADDR; description in $DOCKER_DIR/nodes.json"
}

cmd_down() {
    local n pids=()
    # In parallel: each dockerd takes ~1 s to shut down.
    for n in $(known_nodes); do
        if [ -f "$(node_pidfile "$n")" ] || [ -n "$(dev_pids_matching "$(node_dir "$n")/exec/containerd")" ]; then
            stop_node "$n" &
            pids+=($!)
        fi
    done
    for n in "${pids[@]+"${pids[@]}"}"; do wait "$n" || true; done
    dev_log "registry: $(dev_stop "$REG_DIR/rl360.pid" 10)"
    dev_log "uv stand-in: $(dev_stop "$UV_DIR/rl360.pid" 10)"
    dev_log "python stand-in: $(dev_stop "$PY_DIR/rl360.pid" 10)"
    # No description file while down: tests that only look for it skip.
    rm -f "$DOCKER_DIR/nodes.json"
    dev_log "down: done"
}

cmd_status() {
    local n rc=0
    if dev_running "$REG_DIR/rl360.pid"; then
        dev_log "registry: running on $REG_ADDR (pid $DEV_PID)"
    else
        dev_log "registry: not running"; rc=1
    fi
    if dev_running "$UV_DIR/rl360.pid"; then
        dev_log "uv stand-in: running on 127.0.0.1:$UV_PORT (pid $DEV_PID)"
    else
        dev_log "uv stand-in: not running"   # not a failure: up goes on without it (start_uv_standin)
    fi
    if dev_running "$PY_DIR/rl360.pid"; then
        dev_log "python stand-in: running on 127.0.0.1:$PY_PORT (pid $DEV_PID)"
    else
        dev_log "python stand-in: not running"   # not a failure either (start_python_standin)
    fi
    local nodes
    nodes=$(json_nodes)   # what "up" asked for; else every node ever started
    [ -n "$nodes" ] || nodes=$(known_nodes)
    for n in $nodes; do
        if dev_running "$(node_pidfile "$n")"; then
            dev_log "$n: dockerd running (pid $DEV_PID, unix://$(node_sock "$n"))"
        else
            dev_log "$n: dockerd not running"; rc=1
        fi
    done
    return $rc
}

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in status|help|-h|"") ;; *) dev_lock docker-nodes ;; esac
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down ;;
        status) cmd_status ;;
        images)
            dev_running "$REG_DIR/rl360.pid" || dev_die "registry not running; run: $0 up"
            dev_running "$(node_pidfile n1)" || dev_die "n1 not running; run: $0 up"
            ensure_images force
            make_cold ;;
        standins)
            dev_running "$REG_DIR/rl360.pid" || dev_die "registry not running; run: $0 up"
            dev_running "$(node_pidfile n1)" || dev_die "n1 not running; run: $0 up"
            ensure_images standins ;;
        cold) make_cold ;;
        stop-node) check_node_name "${1:-}"; stop_node "$1"; refresh_json ;;
        kill-node) check_node_name "${1:-}"; stop_node "$1" 0 KILL; refresh_json ;;
        start-node) check_node_name "${1:-}"; start_node "$1"; refresh_json ;;
        purge)
            cmd_down
            # Keep settings.env (ports) so that the next "up" uses the same.
            find "$DOCKER_DIR" -mindepth 1 -maxdepth 1 ! -name settings.env -exec rm -rf {} +
            rm -rf "$REG_DIR" "$DEV_ROOT/build"
            dev_log "purge: removed $DOCKER_DIR and $REG_DIR (cache $DEV_CACHE kept)" ;;
        *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; [ -z "$cmd" ] || [ "$cmd" = help ] || [ "$cmd" = -h ] || exit 2 ;;
    esac
}

main "$@"
