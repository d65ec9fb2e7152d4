"""Terminal-Bench 2.0 tasks on a base stand-in WITHOUT CPython 3.13, as the real image is: each verifier's
`uvx -p 3.13` then downloads uv's managed CPython, which the dev profile's stand-in for those downloads serves
(rl360cli/egress/python_standin.py), through the uv installer's stand-in and the egress proxy's github.com mirror.

    nice -n 10 .venv/bin/python bench/bench_tb2_no_py313.py run --node n3 --only merge-diff-arc-agi-task

A bench, not a test (issue 47, build item 4); the whole-dataset bench is bench/bench_terminal_bench.py, whose
functions this reuses. What differs from it:
- the base: `ubuntu:24.04` only, built from the same Dockerfile (bench/terminal_bench_standin/Dockerfile) with
  `NO_PY313=1` (CPython 3.12 as python3.12, as there; no 3.13) and pushed under the loopback registry's
  `tb2-standin-nopy313/`, which this run's profile names as docker.io's mirror (so only ubuntu:24.04 tasks run);
- the two stand-ins run in this process on free loopback ports (the installer's with `--python-downloads`, the
  managed-Python one with this machine's CPython 3.13), and the profile's two `[egress.mirrors]` name those ports:
  the run does not depend on which version of them the dev services started;
- its own work folder (/tmp/rl360-tb2-nopy313: dataset copy read from /tmp/rl360-tb2, profile, logs), results
  file (bench/results/terminal_bench_2_no_py313.jsonl) and rl360 state (`RL360_STATE` in that folder), so that it
  never touches a running whole-dataset bench. The state matters: each `rl360 tasks check` (re)starts the egress
  proxy of its state's cluster with its own profile, so two benches on the default state cut each other's
  sandboxes and builds off their proxy (seen 2026-12-07: the first run of this bench, on the default state, broke
  one image build of the whole-dataset bench, path-tracing, and lost one task of its own, dna-insert);
- each row adds `oracle_github_bytes`: the bytes the oracle's sandbox got from github.com through the egress
  proxy (its attempt's egress report), i.e. from the stand-in behind the mirror: the list (~600 B), plus the
  CPython archive (39 MB) when uv downloaded it; and `python_standin_gets`: the GETs that reached the stand-in
  during the task (fewer than the verifiers' fetches when the proxy's cache answered them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench.bench_terminal_bench as tb2  # noqa: E402 - after the path
from rl360cli.egress.python_standin import PUBLIC, PythonDownloadsStandIn  # noqa: E402
from rl360cli.egress.uv_standin import UvInstallerStandIn  # noqa: E402

WORK = Path("/tmp/rl360-tb2-nopy313")
RESULTS = tb2.ROOT / "bench" / "results" / "terminal_bench_2_no_py313.jsonl"
NAMESPACE = "tb2-standin-nopy313"
BASE = "ubuntu:24.04"
UV_WHEELS = (Path("/opt/wheels"), Path("/tmp/rl360-dev/cache/wheels"), tb2.WORK / "wheels")


def ensure_standin(node_host: str, force: bool) -> str:
    """ubuntu:24.04's stand-in without CPython 3.13 under tb2-standin-nopy313/library/ (built on the node, pushed)."""
    ref = f"{tb2.REGISTRY}/{NAMESPACE}/library/{BASE}"
    if not force and tb2.registry_has(f"{NAMESPACE}/library/{BASE}"):
        return ref
    start, _default_py, *more = tb2.STANDINS[BASE]
    ctx = WORK / "standin-ctx"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "extra").mkdir(parents=True)
    shutil.copy(tb2.STANDIN_DIR / "Dockerfile", ctx / "Dockerfile")
    for version in more:
        tb2.python_tar(version, ctx / "extra" / f"python{version}.tar")
    built = tb2.docker(node_host, "build", "-q", "--force-rm", "--network", "none",
                       "--build-arg", f"BASE={tb2.REGISTRY}/{start}", "--build-arg", f"STANDS_FOR={BASE}",
                       "--build-arg", "NO_PY313=1", "--build-arg", f"MORE_PY={' '.join(more)}",
                       "--build-arg", "PY313=no CPython 3.13 (uv downloads the managed-Python stand-in's)",
                       "-t", ref, str(ctx))
    if built.returncode != 0:
        sys.exit(f"stand-in {BASE} without 3.13: build failed: {built.stderr[-2000:]}")
    has = tb2.docker(node_host, "run", "--rm", "--network", "none", ref, "sh", "-c", "command -v python3.13 || echo none")
    if has.stdout.strip() != "none":
        sys.exit(f"stand-in {BASE} without 3.13 has python3.13 at {has.stdout.strip()}")
    if tb2.docker(node_host, "push", ref).returncode != 0:
        sys.exit(f"stand-in {BASE} without 3.13: push of {ref} failed")
    shutil.rmtree(ctx, ignore_errors=True)
    print(f"stand-in {BASE} without CPython 3.13: pushed to {ref}", flush=True)
    return ref


def github_bytes(log: Path) -> int | None:
    """The bytes from github.com in the oracle's egress report of a `tasks check --json` log (None: no report)."""
    try:
        egress = (json.loads(log.read_text())["tasks"][0].get("oracle") or {}).get("egress")
    except (OSError, ValueError, KeyError, IndexError):
        return None
    if isinstance(egress, str):  # the check's JSON gives the report as its repr
        found = re.search(r"'github\.com': (\d+)", egress)
        return int(found.group(1)) if found else 0
    return ((egress or {}).get("bytes") or {}).get("github.com", 0) if egress is not None else None


def write_profile(node: dict, uv_url: str, python_url: str) -> Path:
    """The whole-dataset bench's profile, with docker.io mirrored to the no-3.13 stand-in and the two stand-in
    mirrors pointed at this process's stand-ins."""
    text = tb2.write_profile(node).read_text()  # written into tb2.WORK, which run() points at this bench's folder
    for old, new in ((f'"docker.io" = "{tb2.REGISTRY}/{tb2.NAMESPACE}"', f'"docker.io" = "{tb2.REGISTRY}/{NAMESPACE}"'),
                     ('"https://astral.sh/uv/" = "http://127.0.0.1:5081/uv/"', f'"https://astral.sh/uv/" = "{uv_url}"'),
                     (f'"{PUBLIC}" = "http://127.0.0.1:5082/python-build-standalone/"', f'"{PUBLIC}" = "{python_url}"')):
        if old not in text:
            sys.exit(f"the bench's profile has no {old}: update bench/bench_tb2_no_py313.py")
        text = text.replace(old, new)
    path = WORK / "tb2-profile.toml"
    path.write_text(text)
    return path


def run(args) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    # bench_terminal_bench's functions write their profile and logs under its WORK: this bench's folder instead.
    tb2.WORK = WORK
    # Its own rl360 state, hence its own egress proxy (see the docstring); the checks inherit the environment.
    os.environ["RL360_STATE"] = str(WORK / "state" / "state.json")
    node = next(n for n in json.loads(tb2.NODES_JSON.read_text())["nodes"] if n["name"] == args.node)
    ensure_standin(node["docker_host"], args.force)
    wheel = next((w for d in UV_WHEELS for w in sorted(d.glob("uv-0.9.7-*manylinux*x86_64*.whl"))), None)
    if wheel is None:
        sys.exit("no uv 0.9.7 wheel: run bash cluster/dev/docker-nodes.sh up (it downloads one)")
    pythons = sorted(tb2.PYENV.glob("3.13.*"))
    if not pythons:
        sys.exit(f"no CPython 3.13 under {tb2.PYENV}")
    root = Path(args.dataset)
    with (PythonDownloadsStandIn([pythons[-1]]) as python_standin,
          UvInstallerStandIn(wheel, python_downloads=python_standin.list_url()) as uv_standin):
        profile = write_profile(node, uv_standin.url("/uv/"), python_standin.url("/python-build-standalone/"))
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        for task in args.only:
            if tb2.bases_of(root / task) != [BASE]:
                print(f"{task}: its Dockerfile's bases are {tb2.bases_of(root / task)}, not [{BASE!r}]: skipped")
                continue
            before = dict(python_standin.gets)
            row = tb2.check_one(root / task, profile=profile, node_host=node["docker_host"], limit_s=args.limit_s,
                                probe=False, missing=[])
            row |= {"variant": f"{BASE} without CPython 3.13", "node": args.node,
                    "oracle_github_bytes": github_bytes(WORK / "logs" / f"{task}.json"),
                    "python_standin_gets": {p: n - before.get(p, 0) for p, n in python_standin.gets.items()
                                            if n > before.get(p, 0)}}
            with open(RESULTS, "a") as out:
                out.write(json.dumps(row) + "\n")
            tb2.prune(node["docker_host"], task)
            print(f"{time.strftime('%H:%M:%S')} {task}: {row['status']} in {row['seconds']} s "
                  f"(oracle {row.get('oracle_reward')}, no-op {row.get('noop_reward')}; "
                  f"stand-in GETs {row['python_standin_gets']}) {row.get('cause', '')}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--dataset", default=str(tb2.WORK / tb2.FOLDER), help="the extracted copy's folder (read only)")
    p.add_argument("--node", default="n3", help="the dev Docker node the checks run on")
    p.add_argument("--only", nargs="+", required=True, help="the tasks (ubuntu:24.04-based ones)")
    p.add_argument("--limit-s", type=float, default=1800.0, help="a task's check stopped after this")
    p.add_argument("--force", action="store_true", help="build the stand-in again")
    args = parser.parse_args()
    {"run": run}[args.cmd](args)


if __name__ == "__main__":
    main()
