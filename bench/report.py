"""Where benchmark figures go: one `## <title>` section each in docs/benchmarks.md.

Every benchmark rewrites only its own section and leaves the others as they were.
"""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def write_section(title: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace (or append) the section headed `## title` with `body`."""
    heading = f"## {title}"
    text = f"{heading}\n\n{body.rstrip()}\n"
    current = path.read_text() if path.exists() else "# Benchmarks\n"
    lines = current.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        path.write_text(current.rstrip("\n") + "\n\n" + text)
        return
    stop = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[stop:])
    path.write_text("".join(lines[:start]) + text + ("\n" + tail if tail else ""))
