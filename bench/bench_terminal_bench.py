"""Terminal-Bench 2.0 on the dev Docker nodes: `rl360 tasks check --force-build` over each of its 89 tasks.

    nohup nice -n 10 .venv/bin/python bench/bench_terminal_bench.py run > /tmp/rl360-tb2/run.log 2>&1 &
    .venv/bin/python bench/bench_terminal_bench.py table            # print the table of the rows so far
    .venv/bin/python bench/bench_terminal_bench.py table --write    # and put it into docs/benchmarks.md
    .venv/bin/python bench/bench_terminal_bench.py standins --force debian:13.0-slim   # build one again
    .venv/bin/python bench/bench_terminal_bench.py clean            # remove the stand-ins from the node

A bench, not a test (issue 47): hours on two shared cores. Needs the dev Docker nodes and the loopback
registry (`bash cluster/dev/all.sh up`) and a copy of the dataset: the verbatim one in GitHub's
yujianll/skill-usage at f9f89fadc42150d0b3de9dfa8ff31da31607ca89, folder `terminal-bench-2/`. `run` extracts it
from a git directory of that repository (`--git-dir`, default the one the `fetch` tool leaves under /work/.mirror)
file by file, so that a blob the stored copy lacks (its largest files) is listed, not fatal; the tasks that need
such a file get a row saying so and are not run.

Each task is checked alone, one after the other (`-j 1` in one `rl360 tasks check` process of its own, on one
node), so that one bad task never stops the others. Resumable: each finished task appends one row to
bench/results/terminal_bench_2.jsonl and is skipped by the next `run` (`--redo TASK` runs one again). A task that
runs past `--limit-s` (default 1800 s, under the tasks' own 600 s build + 900 s agent + 900 s verifier) is
stopped, its containers removed, and its row says so. `touch /tmp/rl360-tb2/stop` ends a `run` before its next task. After each task the images built for it on the node
(`rl360-task/<task>:*`, `rl360-task/<task>.*:*`) are removed, so the node's disk stays bounded.

Base images. Every TB2 task names a prebuilt `alexgshaw/<task>:20251031` (Docker Hub, unreachable here), so
`--force-build` builds its Dockerfile, whose FROM names a Docker Hub base (python:3.13-slim-bookworm,
ubuntu:24.04, ...), also unreachable. The bench's profile (a copy of cluster/dev-docker.toml, written to the work
folder) mirrors docker.io to the loopback registry's `tb2-standin/`, where `run` first pushes a STAND-IN under each
base name (bench/terminal_bench_standin/Dockerfile says what each is and is not: Debian bookworm with the machine's
own CPython 3.13, which every TB2 verifier's `uvx -p 3.13` then finds instead of downloading one from github.com).
Every row that built an image used one; the table says which. The profile also dates PyPI at the dataset copy's
commit (`pypi_as_of`, docs/sandboxes.md "PyPI as of a date"), as the dev profile does for harbor-cookbook.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "terminal_bench_2.jsonl"
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Terminal-Bench 2.0 on the dev nodes"
STANDIN_DIR = ROOT / "bench" / "terminal_bench_standin"

REPO = "yujianll/skill-usage"
COMMIT = "f9f89fadc42150d0b3de9dfa8ff31da31607ca89"
COMMIT_TIME = "2026-04-07T23:28:21Z"  # the copy's commit, 2026-04-07T16:28:21-07:00: PyPI as of then
FOLDER = "terminal-bench-2"
GIT_DIR = Path("/work/.mirror/yujianll+skill-usage/repo")
WORK = Path("/tmp/rl360-tb2")
STOP = WORK / "stop"  # `touch` it: `run` ends before its next task (the rows so far kept)
REGISTRY = "127.0.0.1:5000"
NAMESPACE = "tb2-standin"  # the registry folder the bench's profile names as docker.io's mirror
NODES_JSON = Path("/tmp/rl360-dev/docker/nodes.json")
PYENV = Path(os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))) / "versions"
PIP_WHEEL_DIRS = (Path("/opt/wheels"), Path("/tmp/rl360-dev/cache/wheels"))

# Each Docker Hub base the dataset's Dockerfiles name -> (the dev registry's stand-in it starts from, the Python
# made `python3` with pip: "" keeps the base's[, one more CPython as python3.X only]).
# bench/terminal_bench_standin/Dockerfile adds CPython 3.13 to all.
STANDINS = {
    # Ubuntu 24.04's python3 is 3.12: mailman's verifier runs `uv venv -p 3.12`, which the real image's apt python3 meets.
    "ubuntu:24.04": ("hub/library/ubuntu:24.04", "", "3.12"),
    "python:3.13-slim-bookworm": ("hub/library/python:3.11-slim", "3.13"),
    "python:3.11-slim": ("hub/library/python:3.11-slim", ""),
    "python:3.11": ("hub/library/python:3.11-slim", ""),
    "python:3.10-slim-bookworm": ("hub/library/python:3.11-slim", "3.10"),
    "debian:bullseye-slim": ("hub/library/ubuntu:24.04", ""),
    "debian:13.0-slim": ("debootstrap:trixie", ""),
}
# ghcr.io's images the Dockerfiles take `COPY --from`: uv's binaries of that very version, from its PyPI wheel
# (images/standin-uv/Dockerfile, as the dev registry's ghcr/astral-sh/uv:latest is made), under tb2-standin-ghcr/.
GHCR_NAMESPACE = "tb2-standin-ghcr"
UV_STANDINS = ("0.8.14", "0.8.15", "0.9.7")  # 0.9.7 is also tagged latest, as the dev registry's is
# A Debian suite's own minbase (from deb.debian.org, which this machine reaches) for a debian:<suite> base, with
# the shared libraries CPython 3.13 links to (the real slim image lacks them); bullseye is no longer on
# deb.debian.org's main archive, so debian:bullseye-slim stays bookworm.
DEBOOTSTRAP_INCLUDE = ("ca-certificates,libssl3t64,libsqlite3-0,libffi8,libbz2-1.0,liblzma5,zlib1g,libreadline8t64,"
                       "libncursesw6")


# ------------------------------------------------------------------------------------------------ the dataset

def extract(git_dir: Path, dest: Path) -> list[str]:
    """The copy's folder, file by file, into `dest`; the paths whose blobs the stored repository lacks."""
    tree = subprocess.run(["git", f"--git-dir={git_dir}", "ls-tree", "-r", "-z", COMMIT, FOLDER],
                          check=True, capture_output=True).stdout.decode()
    missing = []
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for entry in filter(None, tree.split("\0")):
        meta, path = entry.split("\t", 1)
        mode, _, sha = meta.split()
        blob = subprocess.run(["git", f"--git-dir={git_dir}", "cat-file", "blob", sha], capture_output=True)
        target = tmp / Path(path).relative_to(FOLDER)
        target.parent.mkdir(parents=True, exist_ok=True)
        if blob.returncode != 0:
            missing.append(str(Path(path).relative_to(FOLDER)))
        elif mode == "120000":
            target.symlink_to(blob.stdout.decode())
        else:
            target.write_bytes(blob.stdout)
            if mode == "100755":
                target.chmod(0o755)
    (tmp / ".missing").write_text("".join(f"{m}\n" for m in missing))
    tmp.rename(dest)
    return missing


def dataset(args) -> Path:
    dest = Path(args.dataset)
    if not (dest / ".missing").exists():
        if not Path(args.git_dir).exists():
            sys.exit(f"no dataset at {dest} and no git directory {args.git_dir}: fetch github:{REPO} first")
        print(f"extracting {REPO}@{COMMIT[:12]}:{FOLDER} into {dest}", flush=True)
        missing = extract(Path(args.git_dir), dest)
        print(f"  {len(missing)} file(s) absent from the stored copy: {', '.join(missing) or '-'}", flush=True)
    return dest


def tasks_of(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if (p / "task.toml").exists())


def bases_of(task_dir: Path) -> list[str]:
    """The FROM images of the task's Dockerfile (stage names left out)."""
    dockerfile = task_dir / "environment" / "Dockerfile"
    if not dockerfile.exists():
        return []
    out, stages = [], set()
    for line in dockerfile.read_text(errors="replace").splitlines():
        m = re.match(r"\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
        copy = re.match(r"\s*COPY\s+.*--from=(\S+)", line, re.I)
        image = m.group(1) if m else copy.group(1) if copy else None
        if image and image.lower() not in stages and image not in out and not image.isdigit():
            out.append(image)
        if m and m.group(2):
            stages.add(m.group(2).lower())
    return out


def is_standin(image: str) -> bool:
    if image in STANDINS:
        return True
    m = re.fullmatch(r"ghcr\.io/astral-sh/uv:(\S+)", image)
    return bool(m) and (m.group(1) in UV_STANDINS or m.group(1) == "latest")


# ------------------------------------------------------------------------------------------------ the stand-ins

def registry_has(ref: str) -> bool:
    name, tag = ref.rsplit(":", 1)
    req = urllib.request.Request(f"http://{REGISTRY}/v2/{name}/manifests/{tag}", method="HEAD", headers={
        "Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


def docker(node_host: str, *argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "-H", node_host, *argv], text=True, capture_output=True, **kw)


def python_tar(version: str, dest: Path) -> None:
    """pyenv's CPython `version` (built on this same Debian) as a tar of /usr/local's bin/, lib/ and include/ (its
    headers: verifiers build C extensions against it, as they can on the real python images)."""
    home = max(PYENV.glob(f"{version}.*"), key=lambda p: [int(x) for x in p.name.split(".")])
    subprocess.run(["tar", "-C", str(home), "-cf", str(dest), f"--exclude=lib/python{version}/test",
                    f"--exclude=lib/python{version}/idlelib", "--exclude=*.a",
                    f"--exclude=lib/python{version}/site-packages", "--exclude=lib/libpython3.so",
                    "--exclude=lib/pkgconfig", f"bin/python{version}", f"bin/python{version}-config", "lib",
                    f"include/python{version}"], check=True)


def debootstrap_image(suite: str, node_host: str) -> str:
    """`debootstrap --variant=minbase <suite>` imported on the node (its rootfs cached in the work folder)."""
    tar = WORK / f"debootstrap-{suite}-minbase.tar"
    if not tar.exists():
        root = WORK / f"{suite}-rootfs"
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={DEBOOTSTRAP_INCLUDE}",
                        "--cache-dir=/tmp/rl360-dev/cache/debs", suite, str(root), "http://deb.debian.org/debian"],
                       check=True, capture_output=True)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
            for p in (root / junk).glob("*"):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", f"{tar}.tmp", "."], check=True)
        Path(f"{tar}.tmp").rename(tar)
        shutil.rmtree(root)
    ref = f"tb2-standin-base/debian-{suite}:minbase"
    imported = subprocess.run(["docker", "-H", node_host, "import", "--change",
                               "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                               "--change", 'CMD ["bash"]', str(tar), ref], capture_output=True, text=True)
    if imported.returncode != 0:
        sys.exit(f"debootstrap {suite}: import failed: {imported.stderr[-1000:]}")
    return ref


def ensure_standins(node_host: str, force: tuple[str, ...] = ()) -> None:
    """Each stand-in of STANDINS in the registry under tb2-standin/library/ (built on the node and pushed; those
    in `force` built again)."""
    ctx = WORK / "standin-ctx"
    for base, (start, default_py, *more) in STANDINS.items():
        ref = f"{REGISTRY}/{NAMESPACE}/library/{base}"
        if base not in force and registry_has(f"{NAMESPACE}/library/{base}"):
            continue
        t0 = time.monotonic()
        shutil.rmtree(ctx, ignore_errors=True)
        (ctx / "extra").mkdir(parents=True)
        shutil.copy(STANDIN_DIR / "Dockerfile", ctx / "Dockerfile")
        if start.startswith("debootstrap:"):
            start = debootstrap_image(start.split(":", 1)[1], node_host)
            # What this machine added to its trust store (its way out re-signs TLS), as the hub stand-ins have it.
            local = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
            if local:
                (ctx / "extra" / "local-ca").mkdir()
                for crt in local:
                    shutil.copy(crt, ctx / "extra" / "local-ca" / crt.name)
                shutil.copy("/etc/ssl/certs/ca-certificates.crt", ctx / "extra" / "ca-certificates.crt")
        else:
            start = f"{REGISTRY}/{start}"
        for version in ("3.13", *more):
            python_tar(version, ctx / "extra" / f"python{version}.tar")
        if default_py:
            if default_py != "3.13":
                python_tar(default_py, ctx / "extra" / f"python{default_py}.tar")
            wheel = next(p for d in PIP_WHEEL_DIRS for p in sorted(d.glob("pip-*.whl")))
            shutil.copy(wheel, ctx / "extra" / wheel.name)
        built = docker(node_host, "build", "-q", "--force-rm", "--network", "none",
                       "--build-arg", f"BASE={start}", "--build-arg", f"STANDS_FOR={base}",
                       "--build-arg", f"DEFAULT_PY={default_py}", "--build-arg", f"MORE_PY={' '.join(more)}",
                       "--build-arg", f"DEBIAN={start.split('debian-')[1].split(':')[0] if 'debian-' in start else 'bookworm'}", "-t", ref, str(ctx))
        if built.returncode != 0:
            sys.exit(f"stand-in {base}: build failed: {built.stderr[-2000:]}")
        pushed = docker(node_host, "push", ref)
        if pushed.returncode != 0:
            sys.exit(f"stand-in {base}: push failed: {pushed.stderr[-2000:]}")
        print(f"stand-in {base}: built from {start} and pushed to {ref} in {time.monotonic() - t0:.0f} s", flush=True)
    shutil.rmtree(ctx, ignore_errors=True)


def ensure_uv_standins(node_host: str) -> None:
    """ghcr.io/astral-sh/uv:<version> for each of UV_STANDINS under tb2-standin-ghcr/ (built on the node, pushed)."""
    ctx = WORK / "standin-uv-ctx"
    for version in UV_STANDINS:
        tags = [version, "latest"] if version == UV_STANDINS[-1] else [version]
        if all(registry_has(f"{GHCR_NAMESPACE}/astral-sh/uv:{t}") for t in tags):
            continue
        shutil.rmtree(ctx, ignore_errors=True)
        ctx.mkdir(parents=True)
        wheels = WORK / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        "--platform", "manylinux_2_17_x86_64", "-d", str(wheels), f"uv=={version}"], check=True)
        wheel = next(wheels.glob(f"uv-{version}-*manylinux_2_17_x86_64*.whl"))
        with zipfile.ZipFile(wheel) as z:
            for name in ("uv", "uvx"):
                (ctx / name).write_bytes(z.read(f"uv-{version}.data/scripts/{name}"))
                (ctx / name).chmod(0o755)
        text = (ROOT / "images" / "standin-uv" / "Dockerfile").read_text()
        (ctx / "Dockerfile").write_text(text.replace("ghcr.io/astral-sh/uv:latest:", f"ghcr.io/astral-sh/uv:{version}:"))
        refs = [f"{REGISTRY}/{GHCR_NAMESPACE}/astral-sh/uv:{t}" for t in tags]
        built = docker(node_host, "build", "-q", "--force-rm", "--network", "none", "--build-arg",
                       f"UV_VERSION={version}", *[a for r in refs for a in ("-t", r)], str(ctx))
        if built.returncode != 0:
            sys.exit(f"stand-in uv {version}: build failed: {built.stderr[-2000:]}")
        for ref in refs:
            if docker(node_host, "push", ref).returncode != 0:
                sys.exit(f"stand-in uv {version}: push of {ref} failed")
        print(f"stand-in ghcr.io/astral-sh/uv:{version}: pushed as {', '.join(refs)}", flush=True)
    shutil.rmtree(ctx, ignore_errors=True)


def write_profile(node: dict) -> Path:
    """cluster/dev-docker.toml with docker.io mirrored to the stand-ins, one node, PyPI as of the copy's commit."""
    text = (ROOT / "cluster" / "dev-docker.toml").read_text()
    mirror = '"docker.io" = "127.0.0.1:5000/hub"'
    if mirror not in text or "pypi_as_of = " not in text:
        sys.exit("cluster/dev-docker.toml changed: update write_profile in bench/bench_terminal_bench.py")
    text = text.replace(mirror, f'"docker.io" = "{REGISTRY}/{NAMESPACE}"')
    ghcr = '"ghcr.io" = "127.0.0.1:5000/ghcr"'
    if ghcr not in text:
        sys.exit("cluster/dev-docker.toml changed: update write_profile in bench/bench_terminal_bench.py")
    text = text.replace(ghcr, f'"ghcr.io" = "{REGISTRY}/{GHCR_NAMESPACE}"')
    text = re.sub(r'pypi_as_of = "[^"]*"', f'pypi_as_of = "{COMMIT_TIME}"', text)
    text = re.sub(r'name = "dev-docker"', 'name = "dev-docker-tb2"', text, count=1)
    # One node: a task's images are built once, where its oracle and no-op both run. Its reservations cover the
    # dataset's largest task (4 CPUs, 8 GB): they are the admission controller's bookkeeping, not a limit.
    head = text.split("[[nodes]]", 1)[0]
    tail = text.split("[[nodes]]")[-1]
    tail = tail[tail.index("\n#"):] if "\n#" in tail else ""
    text = (head + f'[[nodes]]\nname = "{node["name"]}"\ndocker_host = "{node["docker_host"]}"\n'
            f"cpus = 4.0\nmemory_mb = 16384\n" + tail)
    path = WORK / "tb2-profile.toml"
    path.write_text(f"# Written by bench/bench_terminal_bench.py from cluster/dev-docker.toml.\n{text}")
    return path


# ------------------------------------------------------------------------------------------------ one task

def done_rows() -> dict[str, dict]:
    rows = {}
    if RESULTS.exists():
        for line in RESULTS.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["task"]] = row
    return rows


def first_line(text: str | None, limit: int = 160) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def last_lines(text: str | None, n: int = 3) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-300:]


def cause_of(result: dict) -> str:
    """One line for a task that did not pass: where it failed and, when it shows, the host or resource it needed."""
    if result.get("refused"):
        return f"refused: {first_line(result['refused'])}"
    oracle = result.get("oracle") or {}
    noop = result.get("noop") or {}
    egress = oracle.get("egress") or {}
    denied = sorted(egress.get("denied") or {})
    failed_hosts = sorted(egress.get("failed") or {})
    where = ""
    if denied:
        where = f"; needed {', '.join(denied)} (not allowed by the dev profile)"
    elif failed_hosts:
        where = f"; could not reach {', '.join(failed_hosts)}"
    detail = oracle.get("detail") or ""
    cause = oracle.get("cause")
    if oracle.get("outcome") and oracle.get("outcome") != "ok" and cause:
        text = detail or first_line("; ".join(result.get("problems") or []))
        if cause in ("image_build", "image_pull", "sandbox_start"):
            host = re.search(r"(?:Could not resolve host|resolve|connect to)[: ]+'?([\w.-]+\.[a-z]{2,})", text)
            hint = f"; needed {host.group(1)}" if host and not where else ""
            return f"{cause}: {first_line(text, 200)}{hint}{where}"
        if cause == "timeout" or "timed out" in text or "timeout" in text.lower():
            return f"oracle timeout ({cause}): {first_line(text, 160)}{where}"
        return f"oracle {cause}: {first_line(text, 200)}{where}"
    reward = oracle.get("reward")
    if reward is not None and reward < 1 - 1e-9:
        out = oracle.get("verifier_output") or ""
        hint = ""
        if "github.com" in out or "python-build-standalone" in out:
            hint = "; uv wanted a managed CPython from github.com"
        return f"oracle scored {reward:g}: verifier: {last_lines(out, 2)}{hint}{where}"
    if noop.get("reward") is not None and noop["reward"] >= 1 - 1e-9:
        return "the no-op scored 1: the verifier passes an untouched environment"
    probes = [name for name, r in (result.get("probes") or {}).items() if r and (r.get("reward") or 0) >= 1 - 1e-9]
    if probes:
        return f"probe(s) scored 1: {', '.join(probes)}"
    return first_line("; ".join(result.get("problems") or ["failed"]), 240) + where


def prune(node_host: str, task: str) -> None:
    """Remove the task's check containers and the images built for it on the node (only this task's)."""
    ps = docker(node_host, "ps", "-aq", "--filter", "label=rl360.check=true", "--filter", f"label=rl360.task={task}")
    ids = ps.stdout.split()
    if ids:
        docker(node_host, "rm", "-f", "-v", *ids)
    images = docker(node_host, "images", "--format", "{{.Repository}}:{{.Tag}}", f"rl360-task/{task}")
    more = docker(node_host, "images", "--format", "{{.Repository}}:{{.Tag}}", f"rl360-task/{task}.*")
    refs = [r for r in (images.stdout + more.stdout).split() if not r.endswith(":<none>")]
    if refs:
        docker(node_host, "rmi", "-f", *refs)
    docker(node_host, "image", "prune", "-f", "--filter", "dangling=true")


def check_one(task_dir: Path, *, profile: Path, node_host: str, limit_s: float, probe: bool,
              missing: list[str]) -> dict:
    task = task_dir.name
    bases = bases_of(task_dir)
    row = {"task": task, "bases": bases, "standins": [b for b in bases if is_standin(b)],
           "unmapped_bases": [b for b in bases if b not in STANDINS and "/" not in b.split(":")[0]],
           "dataset": f"{REPO}@{COMMIT}:{FOLDER}", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "probe": probe}
    absent = [m for m in missing if m.startswith(task + "/")]
    if absent:
        return row | {"status": "not run", "seconds": 0.0, "oracle_reward": None, "noop_reward": None,
                      "cause": f"not run: {', '.join(a.split('/', 1)[1] for a in absent)} absent from this "
                               f"machine's snapshot of {REPO} (the `fetch` tool leaves out the largest files)"}
    log = WORK / "logs" / f"{task}.json"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(ROOT / ".venv" / "bin" / "rl360"), "tasks", "check", str(task_dir), "--provider", "docker",
           "--profile", str(profile), "--force-build", "-j", "1", "--json", *(["--probe"] if probe else [])]
    t0 = time.monotonic()
    with open(log, "w") as out, open(log.with_suffix(".stderr"), "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT, start_new_session=True)
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            # SIGINT first, so that the check removes its sandboxes; then the whole group.
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = None
    seconds = round(time.monotonic() - t0, 1)
    row["seconds"] = seconds
    if code is None:
        return row | {"status": "failed", "oracle_reward": None, "noop_reward": None,
                      "cause": f"bench limit: the check ran past {limit_s:.0f} s and was stopped"}
    try:
        doc = json.loads(log.read_text())
        result = doc["tasks"][0]
    except (ValueError, KeyError, IndexError):
        stderr = log.with_suffix(".stderr").read_text(errors="replace")
        return row | {"status": "failed", "oracle_reward": None, "noop_reward": None, "exit": code,
                      "cause": f"rl360 tasks check exited {code}: {last_lines(stderr, 1)}"}
    oracle, noop = result.get("oracle") or {}, result.get("noop") or {}
    row |= {"status": "passed" if result.get("passed") else ("refused" if result.get("refused") else "failed"),
            "exit": code, "oracle_reward": oracle.get("reward"), "noop_reward": noop.get("reward"),
            "oracle_outcome": oracle.get("outcome"), "oracle_cause": oracle.get("cause"),
            "oracle_timings": oracle.get("timings"), "problems": result.get("problems"),
            "probes": {k: (v or {}).get("reward") for k, v in (result.get("probes") or {}).items()},
            "egress_denied": sorted(((oracle.get("egress") or {}).get("denied") or {})),
            "egress_failed": sorted(((oracle.get("egress") or {}).get("failed") or {})),
            "verifier_tail": (oracle.get("verifier_output") or "")[-600:]}
    if not result.get("passed"):
        row["cause"] = cause_of(result)
    return row


def run(args) -> None:
    if os.nice(0) < 10:
        os.nice(10 - os.nice(0))
    WORK.mkdir(parents=True, exist_ok=True)
    root = dataset(args)
    missing = [m for m in (root / ".missing").read_text().splitlines() if m]
    node = next(n for n in json.loads(NODES_JSON.read_text())["nodes"] if n["name"] == args.node)
    ensure_standins(node["docker_host"])
    ensure_uv_standins(node["docker_host"])
    profile = write_profile(node)
    done = done_rows()
    todo = [t for t in tasks_of(root) if t not in done or t in args.redo]
    if args.only:
        todo = [t for t in todo if t in args.only]
    print(f"{len(done)} row(s) already in {RESULTS.relative_to(ROOT)}; {len(todo)} task(s) to check", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    for i, task in enumerate(todo, 1):
        if STOP.exists():
            STOP.unlink()
            print(f"{STOP} found: stopped before {task}", flush=True)
            return
        try:
            row = check_one(root / task, profile=profile, node_host=node["docker_host"], limit_s=args.limit_s,
                            probe=args.probe, missing=missing)
        except Exception as e:  # noqa: BLE001 - one bad task never stops the others
            row = {"task": task, "status": "failed", "seconds": None, "oracle_reward": None, "noop_reward": None,
                   "cause": f"bench error: {type(e).__name__}: {first_line(str(e))}"}
        row["node"] = args.node
        with open(RESULTS, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[{i}/{len(todo)}] {task}: {row['status']} in {row.get('seconds')} s"
              f"{'  ' + row['cause'] if row.get('cause') else ''}", flush=True)
        prune(node["docker_host"], task)


# ------------------------------------------------------------------------------------------------ the table

NOTES = ROOT / "bench" / "results" / "terminal_bench_2_notes.json"
NO_PY313 = ROOT / "bench" / "results" / "terminal_bench_2_no_py313.jsonl"  # bench/bench_tb2_no_py313.py's rows
DENIED = re.compile(r"rl360 egress: (\S+) is not on the profile's \[egress\] allow list")


def verifier_summary(tail: str) -> str:
    """'5 failed, 4 passed; first: test_x - Reason' from the end of a pytest run, else its last line."""
    counts = re.findall(r"=+ ((?:\d+ \w+(?:, )?)+) in [\d.]+s", tail)
    failed = re.search(r"^(?:FAILED|ERROR) \S*::(\S+)(?: - (.*))?$", tail, re.M)
    out = counts[-1] if counts else last_lines(tail, 1)[:120]
    if failed:
        out += f", e.g. {failed.group(1)}" + (f" ({failed.group(2)[:60]})" if failed.group(2) else "")
    return out


REACHED = {"deb.debian.org", "pypi.org", "files.pythonhosted.org", "registry.npmjs.org", "astral.sh"}


def script_needs(task_dir: Path | None, seen: tuple[str, ...] = ()) -> str:
    """What the oracle's solve.sh asks for that the dev nodes lack, read from the script (not observed): Ubuntu
    package versions pinned (the ubuntu:24.04 stand-in is Debian) and the hosts of its URLs the profile neither
    allows nor mirrors."""
    solve = task_dir / "solution" / "solve.sh" if task_dir else None
    if solve is None or not solve.exists():
        return ""
    code = "\n".join(ln for ln in solve.read_text(errors="replace").splitlines() if not ln.lstrip().startswith("#"))
    out = []
    pins = sorted(set(re.findall(r"\b([a-z0-9][a-z0-9+.-]+=[0-9][\w.+:~-]*(?:ubuntu|build)\d[\w.+~-]*)", code)))
    if pins:
        out.append(f"its solve.sh pins Ubuntu packages ({', '.join(pins[:2])}{', ...' if len(pins) > 2 else ''})")
    hosts = sorted({h.lower() for h in re.findall(r"https?://([A-Za-z0-9.-]+\.[A-Za-z]{2,})", code)} - REACHED - set(seen))
    if hosts:
        out.append(f"its solve.sh fetches from {', '.join(hosts[:3])}{', ...' if len(hosts) > 3 else ''}")
    return "; ".join(out)


def build_hosts(task_dir: Path | None) -> list[str]:
    """The unreachable hosts of the URLs in the task's Dockerfile and the shell scripts beside it (read, not seen)."""
    env = task_dir / "environment" if task_dir else None
    if env is None or not env.exists():
        return []
    code = "\n".join(ln for f in [env / "Dockerfile", *env.rglob("*.sh")] if f.is_file()
                     for ln in f.read_text(errors="replace").splitlines() if not ln.lstrip().startswith("#"))
    return sorted({h.lower() for h in re.findall(r"https?://([A-Za-z0-9.-]+\.[A-Za-z]{2,})", code)} - REACHED)


def summarize(row: dict, notes: dict[str, str], task_dir: Path | None = None) -> str:
    """The row's one-line cause: a reviewed note where bench/results/terminal_bench_2_notes.json has one, else
    what the row shows: a host the build or the oracle needed, a timeout, the verifier's own summary."""
    if row["status"] == "passed":
        return ""
    problems = " ".join(row.get("problems") or []) + " " + (row.get("cause") or "")
    note = notes.get(row["task"])
    if note:
        return note
    if row["status"] in ("not run", "refused") or row.get("cause", "").startswith(("bench", "rl360 tasks check")):
        return row.get("cause") or ""
    hosts = sorted(set(DENIED.findall(problems)))
    if row.get("oracle_cause") == "image_build":
        if hosts:
            return f"image build needs {', '.join(hosts)}, not reachable here"
        m = re.search(r"The command '/bin/sh -c (.{0,70}).*?' returned a non-zero code: (\d+)(?: \(its last line: (.{0,90}))?",
                      problems)
        failing = re.search(r"The command '/bin/sh -c (.{1,300}?)(?:' returned|\n|$)", problems)
        wanted = sorted({h.lower() for h in re.findall(r"https?://([A-Za-z0-9.-]+\.[A-Za-z]{2,})",
                                                       failing.group(1) if failing else "")} - REACHED)
        if wanted:
            return f"image build needs {', '.join(wanted)}, not reachable here (`{failing.group(1)[:60].strip()}...` failed)"
        scripts = build_hosts(task_dir)
        if m:
            return (f"image build: `{m.group(1).strip()}` exited {m.group(2)}"
                    + (f"; its build scripts fetch from {', '.join(scripts)} (not reachable here)" if scripts else "")) + (f" ({m.group(3).rstrip(')')})"
                                                                                if m.group(3) else "")
        return row.get("cause") or "image build failed"
    if row.get("oracle_cause"):
        return row.get("cause") or ""
    denied = row.get("egress_denied") or hosts
    where = f"; the oracle or verifier asked for {', '.join(denied)} (not reachable here)" if denied else ""
    if row.get("oracle_reward") is not None and row["oracle_reward"] < 1 - 1e-9:
        needs = script_needs(task_dir, tuple(denied))
        return f"the verifier failed the oracle's result{where}{'; ' + needs if needs else ''}"
    return (row.get("cause") or "") + where


def category(cause: str) -> str:
    """The kind of a failure's one-line cause, for the counts above the table."""
    if "SYS_CHROOT" in cause:
        return "rl360 drops SYS_CHROOT, so the sshd a task starts resets every connection (a departure from Harbor)"
    if cause.startswith("image build needs"):
        return "an image build needs a host not reachable here"
    if cause.startswith(("image build", "image_build")):
        return "an image build failed otherwise"
    if ("asked for" in cause or "needs" in cause) and "not reachable here" in cause:
        return "the oracle or its verifier asked for a host not reachable here"
    if "pins Ubuntu packages" in cause:
        return "the oracle pins Ubuntu 24.04 package versions, which the Debian stand-in lacks"
    if "fetches from" in cause:
        return "the oracle's solve.sh fetches from a host not reachable here (read from it)"
    if cause.startswith("not run"):
        return "not run: a file this machine's snapshot lacks"
    return "other (the cause column)"


def fmt_reward(r) -> str:
    return "-" if r is None else f"{r:g}"


def kinds(ran: list[dict], notes: dict[str, str], root: Path | None) -> list[str]:
    """'The N that did not pass:' and a count per kind of cause, most first."""
    found: dict[str, int] = {}
    for r in ran:
        if r["status"] != "passed":
            kind = category(summarize(r, notes, root / r["task"] if root else None))
            found[kind] = found.get(kind, 0) + 1
    if not found:
        return []
    return [f"The {sum(found.values())} that did not pass, by the first kind their cause line shows:", "",
            *[f"- {n}: {kind}" for kind, n in sorted(found.items(), key=lambda kv: -kv[1])]]


def table(rows: dict[str, dict], all_tasks: list[str], root: Path | None = None) -> str:
    ran = [rows[t] for t in all_tasks if t in rows]
    notes = json.loads(NOTES.read_text()) if NOTES.exists() else {}
    counts = {s: sum(1 for r in ran if r["status"] == s) for s in ("passed", "failed", "refused", "not run")}
    seconds = sum(r.get("seconds") or 0 for r in ran)
    first = min((r["started"] for r in ran if r.get("started")), default="-")
    last = max((r["started"] for r in ran if r.get("started")), default="-")
    used = sorted({b for r in ran for b in (bases_of(root / r["task"]) if root else r.get("bases", []))
                   if is_standin(b)})
    out = [SECTION, "",
           f"`rl360 tasks check --force-build` (each task's oracle, `solution/solve.sh`, must score 1 and a no-op "
           f"must not; `-j 1`, one `rl360` process a task) over Terminal-Bench 2.0, the verbatim copy in GitHub's "
           f"`{REPO}` at commit `{COMMIT}`, folder `{FOLDER}/` (89 tasks), on one dev Docker node (`n4`; the "
           f"machine's 2 cores shared with other work), by `bench/bench_terminal_bench.py` (its docstring says how; "
           f"rows in `bench/results/terminal_bench_2.jsonl`, one per task, the last one counting). A bench, not a "
           f"test. The node's way out is the dev profile's: Debian's, PyPI's (as of the copy's commit, "
           f"{COMMIT_TIME}) and npm's registries, and the uv installer's stand-in for astral.sh; nothing else.", "",
           f"**{len(ran)} of {len(all_tasks)} tasks ran** between {first} and {last} (UTC, each row's start): "
           f"**{counts['passed']} passed, {counts['failed']} failed, {counts['refused']} refused, "
           f"{counts['not run']} not run** (a file this machine's snapshot of the copy lacks); {seconds / 60:.0f} min of checks in all "
           f"(the rows' times summed; a row's time is its whole check: image build, oracle, no-op, verifiers).", "",
           *kinds(ran, notes, root), "",
           "Base images: every task names a prebuilt `alexgshaw/<task>:20251031` on Docker Hub and ships its "
           "Dockerfile; `--force-build` builds that, and its `FROM` (Docker Hub, not reachable here) comes from the "
           f"loopback registry's `{NAMESPACE}/`, which the bench's profile names as docker.io's mirror: a labelled "
           "STAND-IN per base name (`bench/terminal_bench_standin/Dockerfile`), each with this machine's CPython "
           "3.13 as `python3.13` (the verifiers' `uvx -p 3.13` then finds it; on the real images, but "
           "python:3.13's, uv downloads a managed CPython from github.com, not reachable here). "
           "`ubuntu:24.04` and `debian:bullseye-slim` are Debian bookworm (so Ubuntu's package versions are absent; "
           "`ubuntu:24.04`'s also has CPython 3.12 as `python3.12`, Ubuntu 24.04's python3, which mailman's verifier "
           "asks for); "
           "`debian:13.0-slim` is Debian trixie's own debootstrap minbase; `python:3.13-slim-bookworm` and "
           "`python:3.10-slim-bookworm` have pyenv's CPython 3.13.0 / 3.10.13 as `python3` with pip; "
           "`python:3.11-slim` and `python:3.11` are Debian's 3.11 with pip; the pyenv CPythons come with their "
           "headers. `COPY --from=ghcr.io/astral-sh/uv:<version>` takes uv's binaries of that version from its PyPI "
           "wheel (`tb2-standin-ghcr/`). Every row that built an image used "
           f"stand-ins ({', '.join(used) or '-'} so far); the base column says which. Two stand-in gaps found on the "
           "way were closed mid-run and the two rows they had failed run again: the CPythons' headers "
           "(feal-differential-cryptanalysis's verifier builds a C extension) and uv 0.8.14 "
           "(financial-document-processor).", "",
           *no_py313_paragraph(rows),
           "Columns: *oracle* and *no-op*, the rewards the task's verifier gave them (`-`: not run, the image did "
           "not build); *verifier on the oracle*, its pytest summary; *cause*, one line for a failure: what the "
           "row observed (a host the egress proxy refused, a build step, a timeout), then what the oracle's "
           "`solve.sh` asks for that the node lacks, read from the script.", "",
           "To go on from where the rows stop (tasks with a row are skipped; the stand-ins are rebuilt if the "
           "registry lost them):", "",
           "```", "nohup nice -n 10 .venv/bin/python bench/bench_terminal_bench.py run > /tmp/rl360-tb2/run.log 2>&1 &",
           ".venv/bin/python bench/bench_terminal_bench.py table --write   # this section again", "```", "",
           "| task | base | oracle | no-op | verifier on the oracle | result | time (s) | cause |",
           "|---|---|---|---|---|---|---|---|"]
    for task in all_tasks:
        r = rows.get(task)
        if r is None:
            out.append(f"| {task} | | | | | not yet run | | |")
            continue
        images = bases_of(root / task) if root else r.get("bases", [])
        bases = ", ".join(f"{b} (stand-in)" if is_standin(b) else b for b in images)
        cause = summarize(r, notes, root / task if root else None).replace("|", "\\|")
        secs = "-" if r.get("seconds") is None else f"{r['seconds']:.0f}"
        ran_oracle = not r.get("oracle_cause")  # an infrastructure failure (a build) scored nothing
        oracle = fmt_reward(r.get("oracle_reward") if ran_oracle else None)
        noop = fmt_reward(r.get("noop_reward") if ran_oracle else None)
        verifier = verifier_summary(r["verifier_tail"]) if ran_oracle and r.get("verifier_tail") else ""
        out.append(f"| {task} | {bases} | {oracle} | {noop} | {verifier.replace('|', chr(92) + '|')} "
                   f"| {r['status']} | {secs} | {cause} |")
    return "\n".join(out) + "\n"


def no_py313_paragraph(rows: dict[str, dict]) -> list[str]:
    """What bench/bench_tb2_no_py313.py's rows show (ubuntu:24.04 tasks on a stand-in without CPython 3.13, uv
    downloading the managed-Python stand-in's), beside each task's row above."""
    mine: dict[str, dict] = {}
    if NO_PY313.exists():
        for line in NO_PY313.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                mine[row["task"]] = row
    if not mine:
        return []
    passed = [t for t, r in sorted(mine.items()) if r["status"] == "passed"]
    other = [t for t in sorted(mine) if t not in passed]
    # The oracle's bytes from github.com (the stand-in, behind the mirror): the list is ~600 B, the archive 39 MB.
    downloaded = [t for t in passed if (mine[t].get("oracle_github_bytes") or 0) >= 1_000_000]
    listed_only = [t for t in passed if t not in downloaded]

    def why(t: str) -> str:
        return f"{t} ({mine[t].get('cause') or mine[t]['status']})"

    def timed(t: str) -> str:
        here, there = mine[t].get("seconds"), (rows.get(t) or {}).get("seconds")
        return f"{t} ({here:.0f} s" + (f", {there:.0f} s above)" if there is not None else ")")

    return ["**Without CPython 3.13 in the base.** The stand-ins above carry CPython 3.13, which the real bases "
            "(but python:3.13's) lack. The dev profile also has a STAND-IN for uv's managed-Python downloads "
            "(`rl360cli/egress/python_standin.py`, docs/dev-cluster.md): uv 0.9.x checks each download against a "
            "sha256 compiled into it (`crates/uv-python/src/downloads.rs`:795 and :1275-1283 at uv 0.9.5), so other "
            "bytes under github.com's URL cannot pass, and it reads another list only from a local file "
            "(`UV_PYTHON_DOWNLOADS_JSON_URL`, downloads.rs:888-891); so the uv installer's stand-in fetches that "
            "stand-in's list (this machine's CPython 3.13.0 repacked as python-build-standalone's `install_only` "
            "archive, with its sha256) and names it in its `env` file, and uv downloads the archive from github.com's "
            "release URL, which the egress proxy's mirror answers. `bench/bench_tb2_no_py313.py` checked ubuntu:24.04 "
            "tasks again on node n3 with that base's stand-in built without 3.13 (`NO_PY313=1`) and both stand-ins "
            f"(rows in `bench/results/{NO_PY313.name}`): **{len(passed)} of {len(mine)} passed**"
            + (f": {', '.join(timed(t) for t in passed)}" if passed else "")
            + (f"; not passed: {', '.join(why(t) for t in other)}" if other else "")
            + f". In {len(downloaded)} of the {len(passed)} passed the oracle's sandbox got the stand-in's CPython "
            "archive from github.com's URL through the proxy (its egress report)"
            + (f"; in {', '.join(listed_only)} only the list (the verifier asked uv for a Python the image has)"
               if listed_only else "")
            + ". The base stand-ins of the table keep their CPython 3.13 until a run of the whole dataset goes "
            "without it.", ""]


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    start = doc.find(SECTION + "\n")
    if start < 0:
        DOC.write_text(doc.rstrip("\n") + "\n\n" + text)
        return
    end = doc.find("\n## ", start + len(SECTION))
    DOC.write_text(doc[:start] + text + (doc[end:] if end >= 0 else ""))


def show(args) -> None:
    root = Path(args.dataset)
    all_tasks = tasks_of(root) if root.exists() else sorted(done_rows())
    text = table(done_rows(), all_tasks, root if root.exists() else None)
    print(text)
    if args.write:
        write_doc(text)


def standins(args) -> None:
    node = next(n for n in json.loads(NODES_JSON.read_text())["nodes"] if n["name"] == args.node)
    WORK.mkdir(parents=True, exist_ok=True)
    ensure_standins(node["docker_host"], force=tuple(args.force))
    ensure_uv_standins(node["docker_host"])


def clean(args) -> None:
    node = next(n for n in json.loads(NODES_JSON.read_text())["nodes"] if n["name"] == args.node)
    refs = [f"{REGISTRY}/{NAMESPACE}/library/{b}" for b in STANDINS]
    docker(node["docker_host"], "rmi", *refs)
    print(f"removed the stand-ins from {args.node} (the registry keeps them)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("run", "table", "standins", "clean"):
        p = sub.add_parser(name)
        p.add_argument("--dataset", default=str(WORK / FOLDER), help="the extracted copy's folder")
        p.add_argument("--node", default="n4", help="the dev Docker node the checks run on")
        if name == "run":
            p.add_argument("--git-dir", default=str(GIT_DIR), help=f"a git directory of {REPO}")
            p.add_argument("--limit-s", type=float, default=1800.0, help="a task's check stopped after this")
            p.add_argument("--probe", action="store_true", help="tasks check --probe as well (about 4 more verifiers)")
            p.add_argument("--only", nargs="*", default=[], help="only these tasks")
            p.add_argument("--redo", nargs="*", default=[], help="run these again although they have rows")
        if name == "standins":
            p.add_argument("--force", nargs="*", default=[], help="build these base names' stand-ins again")
        if name == "table":
            p.add_argument("--write", action="store_true", help=f"replace '{SECTION}' in docs/benchmarks.md")
    args = parser.parse_args()
    {"run": run, "table": show, "standins": standins, "clean": clean}[args.cmd](args)


if __name__ == "__main__":
    main()
