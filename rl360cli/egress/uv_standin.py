"""UvInstallerStandIn: a loopback stand-in for astral.sh's uv installer, for the dev machines, which reach no
host but Debian's and PyPI's. It is not astral.sh and not its installer.

    python -m rl360cli.egress.uv_standin --port 5081 --wheel DEV_CACHE/wheels/uv-0.9.7-...-x86_64.whl

harbor-cookbook's verifiers run `curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh; source
$HOME/.local/bin/env; uvx ...`. With the dev profile's mirror `"https://astral.sh/uv/" =
"http://127.0.0.1:5081/uv/"` (cluster/dev-docker.toml) the egress proxy answers that https:// URL from here:

- `/uv/<any version>/install.sh` and `/uv/install.sh` (the latest): a stand-in script (it says so when it runs) that downloads
  `https://astral.sh/uv/stand-in/uv-x86_64-unknown-linux-gnu.tar.gz` (under the same mirror key, `--public`,
  so through the same proxy path) and installs `uv` and `uvx` into `$UV_INSTALL_DIR`, else `$XDG_BIN_HOME`, else `$HOME/.local/bin`,
  and writes `env` there as the real installer does (a sh file that puts the folder on PATH);
- `/uv/stand-in/uv-x86_64-unknown-linux-gnu.tar.gz`: `uv` and `uvx` from the uv wheel given (PyPI's
  manylinux x86_64 wheel, which `cluster/dev/docker-nodes.sh up` downloads once), made at start.

Given `--python-downloads URL` (the dev profile's: the managed-Python stand-in's list,
rl360cli/egress/python_standin.py, under its github.com mirror key), the script also fetches that list into
`${XDG_DATA_HOME:-$HOME/.local/share}/uv/rl360-stand-in-python-downloads.json`, and the `env` file it writes sets
`UV_PYTHON_DOWNLOADS_JSON_URL` to it (unless already set): uv reads such a list from a local file only, and verifies
each download against the sha256 of its list, so this is how `uvx -p 3.13` on an image without CPython 3.13 gets
the stand-in's. The real installer does neither. When the list cannot be fetched the script says so and goes on
without it (uv then asks github.com, which is refused).

What it does not do: other architectures or musl (the wheel is x86_64 glibc), the version in the URL (the
wheel's version is installed whatever the URL asks; the script says both), checksums, shell-profile
edits, receipts, `uv self update`. It is started and stopped by `cluster/dev/docker-nodes.sh up` / `down`.

Test: tests/egress/test_uv_standin.py.
"""

from __future__ import annotations

import argparse
import io
import re
import tarfile
import zipfile
from pathlib import Path

from rl360cli.egress.standin import InternetStandIn

TARGET = "uv-x86_64-unknown-linux-gnu"
TARBALL = f"/uv/stand-in/{TARGET}.tar.gz"
# The versioned URL (`/uv/0.9.7/install.sh`) and the latest (`/uv/install.sh`, mcp-tools' oracle).
_INSTALL = re.compile(r"^/uv/(?:([A-Za-z0-9._+-]+)/)?install\.sh$")

SCRIPT = r"""#!/bin/sh
# rl360's STAND-IN for astral.sh's uv installer (rl360cli/egress/uv_standin.py), served on a dev machine
# that reaches no host but Debian's and PyPI's. Not the real installer: it installs uv WHEEL_VERSION from
# PyPI's wheel whatever version the URL asks (ASKED_VERSION), x86_64 glibc only, no checksums, no profile edits.
set -eu
echo "rl360 stand-in for astral.sh's uv installer: installing uv WHEEL_VERSION (the URL asked for ASKED_VERSION)" >&2
[ "$(uname -m)" = x86_64 ] || { echo "rl360 stand-in: only x86_64 is served (this is $(uname -m))" >&2; exit 1; }
dest=${UV_INSTALL_DIR:-${XDG_BIN_HOME:-$HOME/.local/bin}}
url=PUBLIC_PREFIXstand-in/TARGET.tar.gz
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fetch() {
    if command -v curl >/dev/null 2>&1; then curl -fsSL "$1" -o "$2"
    elif command -v wget >/dev/null 2>&1; then wget -q -O "$2" "$1"
    else python3 -c 'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1]).read())' "$1" "$2"
    fi
}
fetch "$url" "$tmp/uv.tar.gz"
tar -xzf "$tmp/uv.tar.gz" -C "$tmp"
mkdir -p "$dest"
for bin in uv uvx; do
    cp "$tmp/TARGET/$bin" "$dest/$bin.tmp" && chmod 755 "$dest/$bin.tmp" && mv -f "$dest/$bin.tmp" "$dest/$bin"
done
# As the real installer writes it: `. "$HOME/.local/bin/env"` puts the folder on PATH once.
cat > "$dest/env" <<EOF
#!/bin/sh
# add binaries to PATH if they aren't added yet
# affix colons on either side of \$PATH to simplify matching
case ":\${PATH}:" in
    *:"$dest":*)
        ;;
    *)
        # Prepending path in case a system-installed binary needs to be overridden
        export PATH="$dest:\$PATH"
        ;;
esac
EOF
# rl360 stand-in only: uv's managed Pythons from the dev profile's stand-in (rl360cli/egress/python_standin.py).
list_url=RL360_PYTHON_LIST
if [ -n "$list_url" ]; then
    list=${XDG_DATA_HOME:-$HOME/.local/share}/uv/rl360-stand-in-python-downloads.json
    mkdir -p "$(dirname "$list")"
    if fetch "$list_url" "$list.tmp"; then
        mv -f "$list.tmp" "$list"
        printf '# rl360 stand-in: uv downloads managed Pythons by this list (rl360cli/egress/python_standin.py)\n[ -n "${UV_PYTHON_DOWNLOADS_JSON_URL:-}" ] || export UV_PYTHON_DOWNLOADS_JSON_URL="%s"\n' "$list" >> "$dest/env"
        echo "rl360 stand-in: uv's managed Pythons from $list_url (UV_PYTHON_DOWNLOADS_JSON_URL in $dest/env)" >&2
    else
        rm -f "$list.tmp"
        echo "rl360 stand-in: no managed-Python list at $list_url; uv will ask github.com for one" >&2
    fi
fi
echo "everything's installed! (rl360 stand-in: uv and uvx in $dest)" >&2
"""


def tarball_of_wheel(wheel: Path) -> tuple[str, bytes]:
    """(the wheel's uv version, a .tar.gz laid out as uv's release archives: TARGET/uv, TARGET/uvx)."""
    out = io.BytesIO()
    version = ""
    with zipfile.ZipFile(wheel) as archive, tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        for name in ("uv", "uvx"):
            member = next((n for n in archive.namelist() if re.fullmatch(rf"uv-[^/]+\.data/scripts/{name}", n)), None)
            if member is None:
                raise SystemExit(f"{wheel} holds no uv-*.data/scripts/{name}: give the uv wheel of PyPI")
            version = member.split("/")[0].removeprefix("uv-").removesuffix(".data")
            data = archive.read(member)
            info = tarfile.TarInfo(f"{TARGET}/{name}")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return version, out.getvalue()


class UvInstallerStandIn(InternetStandIn):
    """The stand-in's HTTP server on 127.0.0.1:`port` (0: any free port); see the module docstring."""

    def __init__(self, wheel: Path, *, port: int = 0, public: str = "https://astral.sh/uv/",
                 python_downloads: str = ""):
        self.version, tarball = tarball_of_wheel(wheel)
        # The managed-Python stand-in's list, as the sandbox reaches it (through a mirror); "": none.
        if not re.fullmatch(r"(https?://[A-Za-z0-9._~:/%+-]+)?", python_downloads):
            raise SystemExit(f"--python-downloads {python_downloads!r}: give a plain http(s) URL")
        self.python_downloads = python_downloads
        # The mirror key this stands behind: the script fetches the tarball from there, through the proxy.
        self.public = public if public.endswith("/") else public + "/"
        super().__init__({TARBALL: tarball}, headers={TARBALL: {"Content-Type": "application/gzip"}},
                         answer=self._installer, port=port)

    def _installer(self, path: str) -> tuple[bytes, dict[str, str]] | None:
        """The installer script, for any version the URL asks."""
        asked = _INSTALL.match(path)
        if asked is None:
            return None
        script = (SCRIPT.replace("WHEEL_VERSION", self.version).replace("ASKED_VERSION", asked.group(1) or "latest")
                  .replace("TARGET", TARGET).replace("PUBLIC_PREFIX", self.public)
                  .replace("RL360_PYTHON_LIST", f"'{self.python_downloads}'"))
        return script.encode(), {"Content-Type": "text/x-shellscript"}

    def url(self, path: str = "/uv/", host: str = "127.0.0.1") -> str:
        return super().url(path, host)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rl360cli.egress.uv_standin", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True, help="the port on 127.0.0.1")
    parser.add_argument("--wheel", type=Path, required=True, help="PyPI's uv wheel (manylinux x86_64)")
    parser.add_argument("--public", default="https://astral.sh/uv/", help="the mirror key it stands behind")
    parser.add_argument("--python-downloads", default="",
                        help="the managed-Python stand-in's list URL, as sandboxes reach it (python_standin.py)")
    args = parser.parse_args(argv)
    standin = UvInstallerStandIn(args.wheel, port=args.port, public=args.public,
                                 python_downloads=args.python_downloads)
    print(f"rl360 stand-in for astral.sh's uv installer: uv {standin.version} on {standin.url()}", flush=True)
    standin.server.serve_forever()


if __name__ == "__main__":
    main()
