"""What a sandbox trusts under `[egress] mode = "allow"` when the profile has an `https://` mirror (or a
dated `https://` index, `pypi_as_of`): the rl360 egress CA (ca.py), beside the roots it trusted already, so
that the proxy can answer a mirrored or dated https:// host as that host while every blind tunnel still
meets the real host's certificate.

Where TLS clients look, and so where the CA goes:
- curl, wget, Python's `ssl` (and pip, through truststore), OpenSSL: the system bundle
  (`/etc/ssl/certs/ca-certificates.crt` on Debian, Ubuntu, Alpine; `/etc/pki/tls/certs/ca-bundle.crt` on
  Fedora and RHEL), or `SSL_CERT_FILE` when set;
- Debian's `update-ca-certificates` (run by the `ca-certificates` package, which `apt-get install curl`
  brings) rebuilds the bundle from the Mozilla roots plus `/usr/local/share/ca-certificates/*.crt`;
- uv: its own bundled Mozilla roots, unless `SSL_CERT_FILE` is set (that file instead) or
  `UV_NATIVE_TLS` / `UV_SYSTEM_CERTS` (the system's store); Python's `requests`: certifi's bundle unless
  `REQUESTS_CA_BUNDLE`.

docker (the sandbox's root is its own and writable under `allow`): at start, as root, the CA is written to
`/usr/local/share/ca-certificates/rl360-egress.crt` (so a bundle that `update-ca-certificates` makes later,
as `apt-get install curl` does, keeps it) and appended to each system bundle that exists then; and every
command gets `SSL_CERT_FILE` naming the system bundle (the first that exists at start, else Debian's path;
left alone when the container's own environment sets it). That names the file curl and OpenSSL read on
Debian anyway, so for them it changes nothing; it is for uv, which otherwise verifies with its bundled roots
only, and which ignores an `SSL_CERT_FILE` that does not exist (its bundled roots then). When a system
bundle exists at start, `REQUESTS_CA_BUNDLE` names it too (unless the image sets it), for `requests`, which
reads certifi's roots otherwise; an image without one leaves `requests` on certifi's (a `REQUESTS_CA_BUNDLE`
naming a file that does not exist yet would fail every request). So curl, Python, pip, uv and `requests`
trust the mirror once the image has a system bundle.

process (the sandbox's /etc is the host's, read-only; the host's trust store is never changed): the host's
system bundle plus the CA is written into the sandbox's folder and bound read-only over the system bundle's
path in the sandbox, and `SSL_CERT_FILE` and `REQUESTS_CA_BUNDLE` name that path (it exists for the
sandbox's whole life), so curl, Python, pip, uv and requests all trust the host's roots and the CA. On a
host without a system bundle its sandboxes trust nothing, the CA included (install `ca-certificates`).

Test: tests/egress/test_egress_sandboxes.py (`test_an_https_mirror_*`, both providers).
"""

from __future__ import annotations

import shlex
from pathlib import Path

# Debian's and Alpine's place for a local CA (update-ca-certificates reads *.crt there).
ANCHOR = "/usr/local/share/ca-certificates/rl360-egress.crt"
# System bundles, most common first: Debian / Ubuntu / Alpine, then Fedora / RHEL.
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def container_trust_command(ca_pem: str) -> str:
    """A shell command (run as root in a container) that writes the CA to ANCHOR, appends it to each system
    bundle that exists (one file once, when several paths name it), and prints, a `NAME=value` line each, the
    environment its commands get (`trust_env`): `SSL_CERT_FILE`, the first system bundle that exists, else
    Debian's path (where update-ca-certificates will write one); `REQUESTS_CA_BUNDLE`, that bundle, only when
    it exists. Neither where the container's own environment sets it."""
    bundles = " ".join(SYSTEM_BUNDLES)
    return (f"mkdir -p {shlex.quote(str(Path(ANCHOR).parent))} && printf '%s' {shlex.quote(ca_pem)} > {ANCHOR}"
            f" && chmod 644 {ANCHOR} && done_='' && first=''; for b in {bundles}; do [ -f \"$b\" ] || continue;"
            " first=${first:-$b}; r=$(readlink -f \"$b\" 2>/dev/null || echo \"$b\");"
            " case \" $done_ \" in *\" $r \"*) continue;; esac;"
            f" cat {ANCHOR} >> \"$r\" && done_=\"$done_ $r\"; done;"
            f" [ -n \"${{SSL_CERT_FILE:-}}\" ] || echo \"SSL_CERT_FILE=${{first:-{SYSTEM_BUNDLES[0]}}}\";"
            " [ -z \"$first\" ] || [ -n \"${REQUESTS_CA_BUNDLE:-}\" ] || echo \"REQUESTS_CA_BUNDLE=$first\"")


def trust_env(printed: str) -> dict[str, str]:
    """The environment `container_trust_command` printed (its `NAME=/path` lines)."""
    pairs = (line.split("=", 1) for line in printed.splitlines() if "=" in line)
    return {name: value for name, value in pairs
            if name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE") and value.startswith("/")}


def process_trust(ca_pem: str, folder: Path) -> tuple[tuple[tuple[str, str], ...], dict[str, str]]:
    """For a process sandbox whose own files are in `folder` (outside its fs): the read-only binds (host file,
    sandbox path) and environment that make it trust the host's roots and the CA."""
    host_bundle = next((Path(b) for b in SYSTEM_BUNDLES if Path(b).is_file()), None)
    if host_bundle is None:  # nothing to bind over in the read-only /etc: its clients trusted nothing before
        return (), {}
    merged = folder / "egress-trust.pem"
    text = host_bundle.read_text()
    merged.write_text(text + ("" if text.endswith("\n") else "\n") + ca_pem)
    merged.chmod(0o644)
    path = str(host_bundle)
    return ((str(merged), path),), {"SSL_CERT_FILE": path, "REQUESTS_CA_BUNDLE": path}
