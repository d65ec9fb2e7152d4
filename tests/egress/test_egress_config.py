"""A profile's [egress]: loaded and validated once, bad input one line that names the fix; host patterns and
mirror rewrites as the proxy applies them."""

from __future__ import annotations

import pytest

from rl360cli.config import load_profile
from rl360cli.configload import ConfigError
from rl360cli.egress.config import EgressConfig

PROFILE = 'name = "p"\n'


def profile(tmp_path, egress: str):
    path = tmp_path / "p.toml"
    path.write_text(PROFILE + egress)
    return load_profile(path)


def test_a_fresh_profile_lets_nothing_out(tmp_path):
    assert profile(tmp_path, "").egress == EgressConfig(mode="none")


def test_the_table_loads(tmp_path):
    egress = profile(tmp_path, '[egress]\nmode = "allow"\nallow = ["pypi.org", "*.debian.org"]\ncache_mb = 64\n'
                               '[egress.mirrors]\n"http://files.example.test/" = "http://127.0.0.1:8081/files/"\n'
                               '[egress.hosts]\n"files.example.test" = "127.0.0.1"\n').egress
    assert (egress.mode, egress.allow, egress.cache_mb) == ("allow", ("pypi.org", "*.debian.org"), 64)
    assert egress.allows("pypi.org") and egress.allows("deb.debian.org")
    assert not egress.allows("debian.org") and not egress.allows("evilpypi.org") and not egress.allows("x.pypi.org")
    assert egress.mirrored("http://files.example.test/a/b.sh") == "http://127.0.0.1:8081/files/a/b.sh"
    assert egress.mirrored("http://files.example.test.evil/a") is None
    assert egress.pinned("files.example.test") == "127.0.0.1"


def test_the_longest_mirror_prefix_wins():
    egress = EgressConfig(mode="allow", mirrors={"http://a.test/": "http://m/one/", "http://a.test/x/": "http://m/two/"})
    assert egress.mirrored("http://a.test/x/y") == "http://m/two/y"
    assert egress.mirrored("http://a.test/z") == "http://m/one/z"


def test_an_https_mirror_names_the_hosts_whose_tls_the_proxy_ends():
    egress = EgressConfig(mode="allow", mirrors={"https://astral.sh/uv/": "http://127.0.0.1:1/uv/",
                                                 "https://m.test:8443/": "https://127.0.0.1:2/",
                                                 "http://plain.test/": "http://127.0.0.1:3/"})
    assert egress.tls_hosts == {("astral.sh", 443), ("m.test", 8443)}
    assert egress.terminates_tls("astral.sh", 443) and not egress.terminates_tls("astral.sh", 8443)
    assert not egress.terminates_tls("plain.test", 443) and not egress.terminates_tls("pypi.org", 443)
    assert egress.mirrored("https://astral.sh/uv/0.9.7/install.sh") == "http://127.0.0.1:1/uv/0.9.7/install.sh"


@pytest.mark.parametrize("egress, says", [
    ('mode = "everything"', "mode"),
    ('allow = ["pypi.org"]', 'set mode = "allow", or remove them'),
    ('mode = "allow"\nallow = ["https://pypi.org"]', "not a URL, port or path"),
    ('mode = "allow"\nallow = ["PyPI.org"]', "lowercase"),
    ('mode = "allow"\nallow = ["pypi.*"]', "only a leading '*.' wildcard"),
    ('mode = "allow"\nallow = ["*.10.0.0.1"]', "not addresses"),
    ('mode = "allow"\n[egress.mirrors]\n"ftp://astral.sh/uv/" = "http://127.0.0.1:1/uv/"', "http:// or https:// URL"),
    ('mode = "allow"\n[egress.mirrors]\n"https://astral.sh" = "http://127.0.0.1:1/uv/"', "needs a path"),
    ('mode = "allow"\n[egress.mirrors]\n"http://a.test/" = "ftp://m/"', "http:// or https:// URL prefix"),
    ('[egress.hosts]\n"a.test" = "not-an-address"', "map a host name to an IP address"),
    ("cache_mb = 0", "cache_mb must be at least 1"),
    ("sandbox_port = 70000", "sandbox_port"),
    ("allow_list = []", "allow"),
])
def test_bad_input_is_one_line_naming_the_fix(tmp_path, egress, says):
    with pytest.raises(ConfigError) as caught:
        profile(tmp_path, "[egress]\n" + egress + "\n")
    message = str(caught.value)
    assert says in message and "\n" not in message, message
