"""The egress proxy's own certificate authority: what lets it end TLS for the hosts of `https://` mirrors.

    ca = EgressCA.load_or_make(Path("STATE/egress/ca"))     # made once per proxy folder, kept after
    ca.pem                                                  # the CA certificate sandboxes trust
    ca.server_context("astral.sh")                          # an SSLContext with a leaf for that host

One CA per proxy folder (`ca.key` 0600 and `ca.crt`, beside the proxy's cache, which is emptied at each
start while the CA is kept): made with the `cryptography` package the first time a proxy starts, read
after. Its key never leaves the node: providers get only the certificate (the proxy's `attach` answer)
and put it where a sandbox's TLS clients look (client.py: `trust_files`). Leaf certificates are made per
host on first use, signed by the CA, all with one key made at start, and kept in memory for the proxy's
life. The CA is constrained to certify servers only (path length 0); it is a name of this node's proxy,
never a way into anything else: a sandbox trusts it for the hosts the proxy answers as itself, which are
exactly the hosts of `https://` mirror keys.

Test: tests/egress/test_proxy.py (`test_an_https_mirror_*`), tests/egress/test_egress_sandboxes.py.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 365
# A leaf is valid from a little before now: a sandbox's clock is the node's, but not to the microsecond.
BACKDATE = datetime.timedelta(hours=1)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class EgressCA:
    """A CA certificate and its key (see the module docstring)."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    folder: Path
    _leaf_key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    _contexts: dict[str, ssl.SSLContext] = field(default_factory=dict)

    @classmethod
    def load_or_make(cls, folder: Path) -> EgressCA:
        """The CA kept in `folder`, made there (key 0600) if it holds none."""
        key_path, cert_path = folder / "ca.key", folder / "ca.crt"
        if key_path.exists() and cert_path.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            if isinstance(key, ec.EllipticCurvePrivateKey) and cert.not_valid_after_utc > _now() + BACKDATE:
                return cls(cert=cert, key=key, folder=folder)
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"rl360 egress CA ({socket.gethostname()})"),
                          x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rl360")])
        now = _now()
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - BACKDATE).not_valid_after(now + datetime.timedelta(days=CA_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                             key_encipherment=False, data_encipherment=False, key_agreement=False,
                                             key_cert_sign=True, crl_sign=True, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(cert=cert, key=key, folder=folder)

    @property
    def pem(self) -> str:
        """The CA certificate, PEM: what a sandbox trusts."""
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server-side SSLContext presenting a certificate for `host` signed by this CA (made once per host)."""
        context = self._contexts.get(host)
        if context is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.set_alpn_protocols(["http/1.1"])  # the proxy speaks HTTP/1.1 only
            # ssl loads a chain only from files: a private temporary folder, removed at once.
            with tempfile.TemporaryDirectory(prefix="rl360-egress-leaf-") as scratch:
                chain, key = Path(scratch) / "chain.pem", Path(scratch) / "key.pem"
                chain.write_bytes(self._leaf(host).public_bytes(serialization.Encoding.PEM)
                                  + self.cert.public_bytes(serialization.Encoding.PEM))
                _write_private(key, self._leaf_key.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
                context.load_cert_chain(chain, key)
            self._contexts[host] = context
        return context

    def _leaf(self, host: str) -> x509.Certificate:
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        now = _now()
        return (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
                .issuer_name(self.cert.subject).public_key(self._leaf_key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - BACKDATE)
                .not_valid_after(min(now + datetime.timedelta(days=LEAF_DAYS), self.cert.not_valid_after_utc))
                .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                               critical=False)
                .sign(self.key, hashes.SHA256()))


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
