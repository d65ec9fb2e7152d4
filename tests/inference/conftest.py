"""Fixtures of the inference tests: a tiny model built from scratch, and real engine servers on loopback.

`tiny_model` is a random 2-layer Llama with a locally trained tokenizer
(rl360cli.inference.testing). `start_engine(...)` runs
`python -m rl360cli.inference.server` as a subprocess on a free 127.0.0.1
port and waits until /health answers; every server a test starts is stopped
(by its own pid) when the test ends.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EngineProcess:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def wait_http_ok(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[:4]} exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not healthy after {timeout_s}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rl360cli.inference.testing import build_tiny_test_model

    return build_tiny_test_model(tmp_path_factory.mktemp("models") / "tiny")


def _launch(model: Path, folder: Path, *args: str, env: dict | None = None) -> EngineProcess:
    port = free_port()
    log = folder / f"engine-{port}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl360cli.inference.server", "--model", str(model), "--port", str(port),
         "--num-threads", "1", *args],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
    )
    return EngineProcess(proc=proc, port=port, log=log)


class EngineFactory:
    """Starts engine servers (in parallel when asked for several) and stops them at teardown."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.started: list[EngineProcess] = []

    def __call__(self, model: Path, *args: str, count: int = 1, env: dict | None = None) -> list[EngineProcess]:
        engines = [_launch(model, self.folder, *args, env=env) for _ in range(count)]
        self.started.extend(engines)
        for e in engines:
            wait_http_ok(e.url + "/health", e.proc, e.log)
        return engines

    def stop_all(self) -> None:
        for e in self.started:
            e.stop()


@pytest.fixture
def start_engine(tmp_path: Path):
    factory = EngineFactory(tmp_path)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def module_engines(tmp_path_factory: pytest.TempPathFactory):
    factory = EngineFactory(tmp_path_factory.mktemp("engines"))
    yield factory
    factory.stop_all()


API_KEY = "sekret"


@pytest.fixture(scope="session")
def keyed_engine(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path):
    """One engine with an API key, shared by the server and client tests (they leave it as they found it)."""
    factory = EngineFactory(tmp_path_factory.mktemp("keyed"))
    yield factory(tiny_model, "--api-key", API_KEY, "--max-wait-ms", "20")[0]
    factory.stop_all()
