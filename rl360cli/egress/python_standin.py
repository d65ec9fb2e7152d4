"""PythonDownloadsStandIn: a loopback STAND-IN for uv's managed-Python downloads (python-build-standalone's
releases on github.com), for the dev machines, which reach no github.com. It is not python-build-standalone:
what it serves is this machine's own CPython (pyenv's), repacked in python-build-standalone's `install_only`
layout, under a build tag that says so (`rl360-stand-in`).

    python -m rl360cli.egress.python_standin --port 5082 --python ~/.pyenv/versions/3.13.0

Why it needs a downloads list, not only the files. uv (0.9.5, which Terminal-Bench 2.0's verifiers install, and
0.9.7, which the dev profile's installer stand-in installs; crates/uv-python/src/downloads.rs of either tag)
knows each managed CPython's URL and sha256 from a list compiled into the binary (`BUILTIN_PYTHON_DOWNLOADS_JSON`,
downloads.rs:795 in 0.9.5) and refuses an archive whose sha256 differs (`HashMismatch`, downloads.rs:1275-1283), so
other bytes under the real URL cannot work. `UV_PYTHON_DOWNLOADS_JSON_URL` replaces that list with another, whose
entries carry their own URL and sha256, but only from a local file: an http(s) URL is refused
(`RemoteJSONNotSupported`, downloads.rs:888-891; uv 0.9.10 and later take an http(s) URL too, astral-sh/uv#16542,
but not the versions here). So this serves, under the mirror key
`https://github.com/astral-sh/python-build-standalone/releases/download/` (cluster/dev-docker.toml's
`[egress.mirrors]` maps it here; the egress proxy ends TLS for github.com, under its CA that the sandboxes trust):

- `/python-build-standalone/rl360-stand-in/python-downloads.json`: a downloads list in uv's format, one entry per
  CPython given, whose URL is the public one above (so uv fetches through the proxy and the mirror) and whose
  sha256 is the archive's: uv verifies what it got;
- `/python-build-standalone/rl360-stand-in/` + `cpython-<version>%2Brl360-stand-in-x86_64-unknown-linux-gnu-`
  `install_only.tar.gz`: `python/bin/python3.X` (its RUNPATH made `$ORIGIN/../lib`, as python-build-standalone's is), `python/lib/`
  (libpython, the stdlib with its `__pycache__`, lib-dynload), `python/include/python3.X`; the `_sysconfigdata`
  and pkg-config files name the prefix `/install`, which uv rewrites to where it installed (as for the real ones).

The list reaches the sandbox through the installer's stand-in (rl360cli/egress/uv_standin.py, `--python-downloads`):
its script fetches the list next to uv and its `env` file sets `UV_PYTHON_DOWNLOADS_JSON_URL`, so a verifier that
runs `curl -LsSf https://astral.sh/uv/<v>/install.sh | sh; source $HOME/.local/bin/env; uvx -p 3.13 ...` (79 of
Terminal-Bench 2.0's 89) gets this machine's CPython 3.13 from here instead of python-build-standalone's from
github.com. A uv that did not come from that installer (an image's own, `COPY --from=ghcr.io/astral-sh/uv`) gets
no list and asks github.com when it needs a CPython (refused); TB2's one such `uvx -p 3.13`, reshard-c4-data's,
runs on python:3.13, which has one.

What it does not do: python-build-standalone's builds (those link OpenSSL, SQLite, libffi, ... statically and run
on any glibc Linux; this one needs the image to have the shared libraries its extension modules link to:
libssl3, libsqlite3, libffi8, libbz2, liblzma, zlib, libreadline, libncursesw, libuuid, else `import ssl` etc.
fail there), the real versions and sha256s (uv's compiled-in list is replaced, not extended: only the versions given
are downloadable), other architectures, musl, free-threaded or debug variants, PyPy, pip (site-packages is empty),
the `full` archives. Started and stopped by `cluster/dev/docker-nodes.sh up` / `down`.

Test: tests/egress/test_python_standin.py.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import struct
import tarfile
from pathlib import Path

from rl360cli.egress.standin import InternetStandIn

PUBLIC = "https://github.com/astral-sh/python-build-standalone/releases/download/"
PREFIX = "/python-build-standalone/"  # the stand-in's own path for PUBLIC
TAG = "rl360-stand-in"  # the release tag and build name: uv prints it, and writes it to the install's BUILD file
LIST = "python-downloads.json"
TRIPLE = "x86_64-unknown-linux-gnu"
# Left out of the archive: the test suite, IDLE, static libraries, and what was pip-installed into the machine's
# interpreter (site-packages keeps its README only).
_SKIP = re.compile(r"^lib/python3\.\d+/(test|idlelib)(/|$)|\.a$|^lib/python3\.\d+/site-packages/(?!README\.txt$)")
_DT_RPATH, _DT_RUNPATH, _SHT_DYNAMIC = 15, 29, 6


def set_runpath(elf: bytes, runpath: str) -> bytes:
    """`elf` (a 64-bit little-endian ELF) with its DT_RUNPATH / DT_RPATH string replaced by `runpath` in place
    (NUL-padded; it must not be longer than the old one). pyenv links python to its prefix's lib/ by an absolute
    RUNPATH; moved elsewhere it would not find libpython."""
    data = bytearray(elf)
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    found = 0
    for _name, kind, _flags, _addr, offset, size, link, *_ in sections:
        if kind != _SHT_DYNAMIC:
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag in (_DT_RPATH, _DT_RUNPATH):
                start = strtab + value
                old_len = data.index(0, start) - start
                new = runpath.encode()
                if len(new) > old_len:
                    raise ValueError(f"RUNPATH {runpath!r} is longer than the one it replaces ({old_len} bytes)")
                data[start:start + old_len] = new + b"\0" * (old_len - len(new))
                found += 1
    if not found:
        raise ValueError("the ELF file has no RUNPATH or RPATH to replace")
    return bytes(data)


def install_only_archive(home: Path) -> tuple[str, bytes]:
    """(the CPython's version "3.13.0", a .tar.gz of `home` (a CPython installed under its own prefix, as pyenv
    does) in python-build-standalone's install_only layout; see the module docstring)."""
    home = home.resolve()
    binary = next(iter(sorted(home.glob("bin/python3.[0-9]*[0-9]"))), None)
    if binary is None:
        raise SystemExit(f"{home} holds no bin/python3.X: give a CPython's prefix (e.g. ~/.pyenv/versions/3.13.0)")
    minor = binary.name.removeprefix("python")
    patchlevel = home / "include" / f"python{minor}" / "patchlevel.h"
    found = re.search(r'#define PY_VERSION\s+"(\d+\.\d+\.\d+)"', patchlevel.read_text() if patchlevel.exists() else "")
    if found is None:
        raise SystemExit(f"{patchlevel}: no final release's PY_VERSION (give a CPython with its headers)")
    version = found.group(1)
    prefix = str(home)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        def add(rel: str, data: bytes | None = None, link: str | None = None, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(f"python/{rel}")
            if link is not None:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, link, 0o777
                tar.addfile(info)
                return
            info.size, info.mode = len(data or b""), mode
            tar.addfile(info, io.BytesIO(data or b""))

        add(f"bin/python{minor}", set_runpath(binary.read_bytes(), "$ORIGIN/../lib"), mode=0o755)
        add("bin/python3", link=f"python{minor}")
        for path in sorted((home / "lib").rglob("*")):
            rel = path.relative_to(home).as_posix()
            if _SKIP.search(rel):
                continue
            if path.is_symlink():
                add(rel, link=str(path.readlink()))
            elif path.is_dir():
                continue
            elif path.name.startswith("_sysconfigdata_") and path.suffix == ".py" or path.suffix == ".pc":
                # As python-build-standalone builds it: the prefix is /install, which uv rewrites when it installs.
                add(rel, path.read_text().replace(prefix, "/install").encode())
            else:
                add(rel, path.read_bytes(), mode=path.stat().st_mode & 0o777)
        for path in sorted((home / "include" / f"python{minor}").rglob("*")):
            if path.is_file():
                add(path.relative_to(home).as_posix(), path.read_bytes())
    return version, out.getvalue()


def archive_name(version: str) -> str:
    """The archive's file name in the release, as python-build-standalone names it (`+` as `%2B` in the URL)."""
    return f"cpython-{version}%2B{TAG}-{TRIPLE}-install_only.tar.gz"


def downloads_list(archives: dict[str, bytes], public: str = PUBLIC) -> bytes:
    """uv's downloads list (the format of crates/uv-python/download-metadata.json) for each version's archive."""
    entries = {}
    for version, archive in archives.items():
        major, minor, patch = (int(part) for part in version.split("."))
        entries[f"cpython-{version}-linux-x86_64-gnu"] = {
            "name": "cpython", "arch": {"family": "x86_64", "variant": None}, "os": "linux", "libc": "gnu",
            "major": major, "minor": minor, "patch": patch, "prerelease": "",
            "url": f"{public}{TAG}/{archive_name(version)}", "sha256": hashlib.sha256(archive).hexdigest(),
            "variant": None, "build": TAG}
    return json.dumps(entries, indent=1).encode()


class PythonDownloadsStandIn(InternetStandIn):
    """The stand-in's HTTP server on 127.0.0.1:`port` (0: any free port); see the module docstring."""

    def __init__(self, pythons: list[Path], *, port: int = 0, public: str = PUBLIC):
        archives = dict(install_only_archive(home) for home in pythons)
        self.versions = sorted(archives)
        self.public = public if public.endswith("/") else public + "/"
        files = {f"{PREFIX}{TAG}/{archive_name(v)}": data for v, data in archives.items()}
        headers = {path: {"Content-Type": "application/gzip"} for path in files}
        self.list_path = f"{PREFIX}{TAG}/{LIST}"
        files[self.list_path] = downloads_list(archives, self.public)
        headers[self.list_path] = {"Content-Type": "application/json"}
        super().__init__(files, headers=headers, port=port)

    def list_url(self) -> str:
        """The downloads list's public URL (under the mirror key), which the installer's stand-in fetches."""
        return f"{self.public}{TAG}/{LIST}"

    def url(self, path: str = PREFIX, host: str = "127.0.0.1") -> str:
        return super().url(path, host)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rl360cli.egress.python_standin",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the port on 127.0.0.1")
    parser.add_argument("--python", type=Path, action="append", required=True,
                        help="a CPython's prefix (pyenv's ~/.pyenv/versions/3.13.0); repeat for more versions")
    parser.add_argument("--public", default=PUBLIC, help="the mirror key it stands behind")
    args = parser.parse_args(argv)
    standin = PythonDownloadsStandIn(args.python, port=args.port, public=args.public)
    print(f"rl360 stand-in for python-build-standalone's downloads: CPython {', '.join(standin.versions)} "
          f"on {standin.url()}, list {standin.list_url()}", flush=True)
    standin.server.serve_forever()


if __name__ == "__main__":
    main()
