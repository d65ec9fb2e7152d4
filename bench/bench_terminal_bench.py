"""Terminal-Bench 2.0 on the dev Docker nodes: `rl360 tasks check --force-build` over each of its 89 tasks.

    nohup nice -n 10 .venv/bin/python bench/bench_terminal_bench.py run > /tmp/rl360-tb2/run.log 2>&1 &
    .venv/bin/python bench/bench_terminal_bench.py table            # print the table of the rows so far
    .venv/bin/python bench/bench_terminal_bench.py table --write    # and put it into docs/benchmarks.md
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
stopped, its containers removed, and its row says so. After each task the images built for it on the node
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
REGISTRY = "127.0.0.1:5000"
NAMESPACE = "tb2-standin"  # the registry folder the bench's profile names as docker.io's mirror
NODES_JSON = Path("/tmp/rl360-dev/docker/nodes.json")
PYENV = Path(os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))) / "versions"
PIP_WHEEL_DIRS = (Path("/opt/wheels"), Path("/tmp/rl360-dev/cache/wheels"))

# Each Docker Hub base the dataset's Dockerfiles name -> (the dev registry's stand-in it starts from, the Python
# made `python3` with pip: "" keeps the base's). bench/terminal_bench_standin/Dockerfile adds CPython 3.13 to all.
STANDINS = {
    "ubuntu:24.04": ("hub/library/ubuntu:24.04", ""),
    "python:3.13-slim-bookworm": ("hub/library/python:3.11-slim", "3.13"),
    "python:3.11-slim": ("hub/library/python:3.11-slim", ""),
    "python:3.11": ("hub/library/python:3.11-slim", ""),
    "python:3.10-slim-bookworm": ("hub/library/python:3.11-slim", "3.10"),
    "debian:bullseye-slim": ("hub/library/ubuntu:24.04", ""),
    "debian:13.0-slim": ("hub/library/ubuntu:24.04", ""),
}


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
        if m:
            if m.group(1).lower() not in stages:
                out.append(m.group(1))
            if m.group(2):
                stages.add(m.group(2).lower())
    return out


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
    """pyenv's CPython `version` (built on this same Debian) as a tar of /usr/local's bin/ and lib/."""
    home = max(PYENV.glob(f"{version}.*"), key=lambda p: [int(x) for x in p.name.split(".")])
    subprocess.run(["tar", "-C", str(home), "-cf", str(dest), f"--exclude=lib/python{version}/test",
                    f"--exclude=lib/python{version}/idlelib", f"--exclude=lib/python{version}/config-*",
                    f"--exclude=lib/python{version}/site-packages", "--exclude=lib/libpython3.so",
                    "--exclude=lib/pkgconfig", f"bin/python{version}", "lib"], check=True)


def ensure_standins(node_host: str) -> None:
    """Each stand-in of STANDINS in the registry under tb2-standin/library/ (built on the node and pushed)."""
    ctx = WORK / "standin-ctx"
    for base, (start, default_py) in STANDINS.items():
        ref = f"{REGISTRY}/{NAMESPACE}/library/{base}"
        if registry_has(f"{NAMESPACE}/library/{base}"):
            continue
        t0 = time.monotonic()
        shutil.rmtree(ctx, ignore_errors=True)
        (ctx / "extra").mkdir(parents=True)
        shutil.copy(STANDIN_DIR / "Dockerfile", ctx / "Dockerfile")
        python_tar("3.13", ctx / "extra" / "python3.13.tar")
        if default_py:
            if default_py != "3.13":
                python_tar(default_py, ctx / "extra" / f"python{default_py}.tar")
            wheel = next(p for d in PIP_WHEEL_DIRS for p in sorted(d.glob("pip-*.whl")))
            shutil.copy(wheel, ctx / "extra" / wheel.name)
        built = docker(node_host, "build", "-q", "--force-rm", "--network", "none",
                       "--build-arg", f"BASE={REGISTRY}/{start}", "--build-arg", f"STANDS_FOR={base}",
                       "--build-arg", f"DEFAULT_PY={default_py}", "-t", ref, str(ctx))
        if built.returncode != 0:
            sys.exit(f"stand-in {base}: build failed: {built.stderr[-2000:]}")
        pushed = docker(node_host, "push", ref)
        if pushed.returncode != 0:
            sys.exit(f"stand-in {base}: push failed: {pushed.stderr[-2000:]}")
        print(f"stand-in {base}: built from {start} and pushed to {ref} in {time.monotonic() - t0:.0f} s", flush=True)
    shutil.rmtree(ctx, ignore_errors=True)


def write_profile(node: dict) -> Path:
    """cluster/dev-docker.toml with docker.io mirrored to the stand-ins, one node, PyPI as of the copy's commit."""
    text = (ROOT / "cluster" / "dev-docker.toml").read_text()
    mirror = '"docker.io" = "127.0.0.1:5000/hub"'
    if mirror not in text or "pypi_as_of = " not in text:
        sys.exit("cluster/dev-docker.toml changed: update write_profile in bench/bench_terminal_bench.py")
    text = text.replace(mirror, f'"docker.io" = "{REGISTRY}/{NAMESPACE}"')
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
    row = {"task": task, "bases": bases, "standins": [b for b in bases if b in STANDINS],
           "unmapped_bases": [b for b in bases if b not in STANDINS and "/" not in b.split(":")[0]],
           "dataset": f"{REPO}@{COMMIT}:{FOLDER}", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "probe": probe}
    absent = [m for m in missing if m.startswith(task + "/")]
    if absent:
        return row | {"status": "not run", "seconds": 0.0, "oracle_reward": None, "noop_reward": None,
                      "cause": f"not run: {', '.join(a.split('/', 1)[1] for a in absent)} absent from the stored "
                               f"copy of {REPO} (a large file its snapshot lacks)"}
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
    profile = write_profile(node)
    done = done_rows()
    todo = [t for t in tasks_of(root) if t not in done or t in args.redo]
    if args.only:
        todo = [t for t in todo if t in args.only]
    print(f"{len(done)} row(s) already in {RESULTS.relative_to(ROOT)}; {len(todo)} task(s) to check", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    for i, task in enumerate(todo, 1):
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

def fmt_reward(r) -> str:
    return "-" if r is None else f"{r:g}"


def table(rows: dict[str, dict], all_tasks: list[str]) -> str:
    ran = [rows[t] for t in all_tasks if t in rows]
    counts = {s: sum(1 for r in ran if r["status"] == s) for s in ("passed", "failed", "refused", "not run")}
    seconds = sum(r.get("seconds") or 0 for r in ran)
    first = min((r["started"] for r in ran if r.get("started")), default="-")
    last = max((r["started"] for r in ran if r.get("started")), default="-")
    out = [SECTION, "",
           f"`rl360 tasks check --force-build` (oracle and no-op, `-j 1`, one task a process) over every task of "
           f"Terminal-Bench 2.0, the verbatim copy in `{REPO}` at `{COMMIT}`, folder `{FOLDER}/`, on one dev "
           f"Docker node (2 cores shared with other work), by `bench/bench_terminal_bench.py` "
           f"(rows: `bench/results/terminal_bench_2.jsonl`).", "",
           f"**{len(ran)} of {len(all_tasks)} tasks ran** between {first} and {last} (UTC, each row's start): "
           f"{counts['passed']} passed, {counts['failed']} failed, {counts['refused']} refused, "
           f"{counts['not run']} not run (a file the stored copy lacks); {seconds / 60:.0f} min of checks in all "
           f"(the rows' times summed).", "",
           "| task | base (stand-in) | oracle | no-op | result | time (s) | cause |", "|---|---|---|---|---|---|---|"]
    for task in all_tasks:
        r = rows.get(task)
        if r is None:
            out.append(f"| {task} | | | | not yet run | | |")
            continue
        bases = ", ".join(f"{b} (stand-in)" if b in r.get("standins", []) else b for b in r.get("bases", []))
        cause = (r.get("cause") or "").replace("|", "\\|")
        secs = "-" if r.get("seconds") is None else f"{r['seconds']:.0f}"
        out.append(f"| {task} | {bases} | {fmt_reward(r.get('oracle_reward'))} | {fmt_reward(r.get('noop_reward'))} "
                   f"| {r['status']} | {secs} | {cause} |")
    return "\n".join(out) + "\n"


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
    text = table(done_rows(), all_tasks)
    print(text)
    if args.write:
        write_doc(text)


def clean(args) -> None:
    node = next(n for n in json.loads(NODES_JSON.read_text())["nodes"] if n["name"] == args.node)
    refs = [f"{REGISTRY}/{NAMESPACE}/library/{b}" for b in STANDINS]
    docker(node["docker_host"], "rmi", *refs)
    print(f"removed the stand-ins from {args.node} (the registry keeps them)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("run", "table", "clean"):
        p = sub.add_parser(name)
        p.add_argument("--dataset", default=str(WORK / FOLDER), help="the extracted copy's folder")
        p.add_argument("--node", default="n4", help="the dev Docker node the checks run on")
        if name == "run":
            p.add_argument("--git-dir", default=str(GIT_DIR), help=f"a git directory of {REPO}")
            p.add_argument("--limit-s", type=float, default=1800.0, help="a task's check stopped after this")
            p.add_argument("--probe", action="store_true", help="tasks check --probe as well (about 4 more verifiers)")
            p.add_argument("--only", nargs="*", default=[], help="only these tasks")
            p.add_argument("--redo", nargs="*", default=[], help="run these again although they have rows")
        if name == "table":
            p.add_argument("--write", action="store_true", help=f"replace '{SECTION}' in docs/benchmarks.md")
    args = parser.parse_args()
    {"run": run, "table": show, "clean": clean}[args.cmd](args)


if __name__ == "__main__":
    main()
