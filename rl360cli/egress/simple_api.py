"""PyPI's Simple API as of a date: a project page without the files uploaded after it.

    page = files_as_of(body, datetime(2026, 4, 23, tzinfo=UTC))   # body: a PEP 691 JSON project page

A project page in JSON (PEP 691, `application/vnd.pypi.simple.v1+json`, which uv and pip since 22.2 ask
for first) lists every file with its `upload-time` (PEP 700). Dropping the files uploaded after the date
is all it takes for any installer that reads the page to resolve as it would have on that date: it never
learns of a newer release. `versions` (PEP 700) loses the versions whose every file went. The HTML form
(PEP 503) carries no upload time, so a page in HTML cannot be dated: `NotDatable`, which the proxy
answers as a failure rather than serve an undated page as if it were dated.

What the date does not change: a file yanked since is still yanked (the page says so today, not when);
the files themselves (files.pythonhosted.org) are what they always were, their hashes on the page.

Used by proxy.py (`[egress] pypi_as_of`, config.py). Test: tests/egress/test_pypi_as_of.py.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

from packaging.version import InvalidVersion, Version

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
# An sdist's or another archive's endings (a wheel's name says its version in its second field).
_ARCHIVES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".zip", ".tar")


class NotDatable(ValueError):
    """A page that cannot be dated (HTML, or a file without `upload-time`): one line saying why."""


def accepts_json(accept: str) -> bool:
    """Whether a request's `Accept` takes the JSON form (uv's and pip's do; pip before 22.2 asks for HTML)."""
    return any(part.split(";")[0].strip().lower() == JSON_TYPE for part in accept.split(","))


def files_as_of(body: bytes, as_of: datetime) -> bytes:
    """The JSON project page `body` without the files uploaded after `as_of` (aware); `versions`, if the
    page has it, without the versions none of whose files is left. Raises NotDatable."""
    try:
        page = json.loads(body)
        files = page["files"]
        if not isinstance(files, list) or not all(isinstance(f, dict) and "filename" in f for f in files):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise NotDatable("not a PEP 691 JSON project page") from None
    kept, dropped = [], []
    for file in files:
        (kept if _uploaded(file) <= as_of else dropped).append(file)
    page["files"] = kept
    if "versions" in page and dropped:
        name = _canonical_name(page.get("name", ""))
        left = {version_of(f["filename"], name) for f in kept}
        gone = {version_of(f["filename"], name) for f in dropped} - left - {None}
        page["versions"] = [v for v in page["versions"] if _canonical_version(v) not in gone]
    return json.dumps(page).encode()


def _uploaded(file: dict) -> datetime:
    try:
        moment = datetime.fromisoformat(file["upload-time"])
    except (KeyError, TypeError, ValueError):
        moment = None
    if moment is None or moment.tzinfo is None:
        raise NotDatable(f"{file.get('filename')} has no upload-time with a zone (PEP 700: Simple API 1.1 or later)")
    return moment


def version_of(filename: str, project: str) -> str | None:
    """The version a distribution's file name says (canonical), None when it cannot be told; `project`:
    the project's canonical name (an sdist's name may hold dashes, so it is matched, not split)."""
    if filename.endswith((".whl", ".egg")):
        parts = filename.split("-")
        return _canonical_version(parts[1]) if len(parts) > 2 else None
    stem = next((filename[: -len(end)] for end in _ARCHIVES if filename.endswith(end)), None)
    if stem is None:
        return None
    for at, char in enumerate(stem):
        if char == "-" and _canonical_name(stem[:at]) == project:
            return _canonical_version(stem[at + 1:])
    return None


def _canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _canonical_version(version: str) -> str:
    """PEP 440's normal form, else (a version PEP 440 does not read) the text lowercased."""
    try:
        return str(Version(version))
    except InvalidVersion:
        return version.lower()
