"""The Dockerfile reader: continuations, comments, forms, WORKDIR, and the build-context hash."""

from __future__ import annotations

import os

from rl360cli.sandbox import dockerfile


def test_instructions_with_continuations_comments_and_forms():
    text = """# syntax is ignored
FROM base:1 AS build

# a comment
RUN apt-get update && \\
    # a comment inside a continuation
    apt-get install -y x
COPY ["a b.txt", "/dst/"]
ENV A=1 \\
    B=2
workdir /app
"""
    got = dockerfile.parse(text)
    assert [(i.keyword, i.line) for i in got] == [("FROM", 2), ("RUN", 5), ("COPY", 8), ("ENV", 9), ("WORKDIR", 11)]
    assert got[1].args == "apt-get update && apt-get install -y x"
    assert got[2].is_json_form() and got[2].words() == ["a b.txt", "/dst/"]
    assert not got[1].is_json_form() and got[0].words() == ["base:1", "AS", "build"]
    assert got[3].args == "A=1 B=2"


def test_escape_directive():
    got = dockerfile.parse("# escape=`\nFROM x\nRUN echo a `\n  b\n")
    assert got[1].args == "echo a b"


def test_last_workdir_resolves_relative_paths():
    assert dockerfile.last_workdir(dockerfile.parse("FROM x\nWORKDIR /a\nWORKDIR b\nWORKDIR ../c\n")) == "/a/c"
    assert dockerfile.last_workdir(dockerfile.parse("FROM x\n")) is None


def test_context_hash_sees_content_names_and_the_execute_bit(tmp_path):
    (tmp_path / "f").write_text("1")
    first = dockerfile.context_hash(tmp_path)
    assert dockerfile.context_hash(tmp_path) == first
    os.chmod(tmp_path / "f", 0o755)
    second = dockerfile.context_hash(tmp_path)
    assert second != first
    (tmp_path / "f").rename(tmp_path / "g")
    assert dockerfile.context_hash(tmp_path) != second


def test_several_sources_into_dot_are_written_for_the_classic_builder():
    from rl360cli.sandbox.dockerfile import for_classic_builder

    text = ("FROM x\nWORKDIR /app\nCOPY server.py persona.md .\nCOPY a .\nCOPY --chown=1 a b .\r\nADD a b ./\n"
            'COPY ["a", "b", "."]\nRUN echo a b .\n')
    assert for_classic_builder(text) == (
        "FROM x\nWORKDIR /app\nCOPY server.py persona.md ./\nCOPY a .\nCOPY --chown=1 a b ./\r\nADD a b ./\n"
        'COPY ["a", "b", "."]\nRUN echo a b .\n')



def test_the_sources_the_docker_daemon_would_fetch_itself_are_found():
    text = ("FROM x\nADD local.txt /a\nADD --chmod=644 https://example.test/f.tgz \\\n    /opt/\n"
            'ADD ["http://example.test/a", "b", "/c/"]\nADD git@github.com:o/r.git /src\nCOPY http://x /y\n')
    found = [(ins.line, url) for ins, url in dockerfile.fetched_by_the_daemon(dockerfile.parse(text))]
    assert found == [(3, "https://example.test/f.tgz"), (5, "http://example.test/a"),
                     (6, "git@github.com:o/r.git")]
