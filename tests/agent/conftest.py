"""The agent tests' fixtures: process sandboxes as the sandbox tests make them (tests/sandbox/conftest.py), and
a run folder as the loop tests make one (tests/loop/conftest.py)."""

from tests.loop.conftest import run_folder  # noqa: F401
from tests.sandbox.conftest import bwrap, process_config, process_provider, sandbox_root  # noqa: F401
