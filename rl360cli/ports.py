"""Free TCP ports on the loopback interface, for the rendezvous of process groups and for runs
that need a block of them (a profile's `base_port`).

    port = free_port(29600)   # 29600 if nothing listens there, else any free port
    base = free_port_block(20)  # base .. base + 19 all free
"""

from __future__ import annotations

import random
import socket


def free_port(preferred: int = 0) -> int:
    """`preferred` if it is free on 127.0.0.1, else any free port there."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise RuntimeError("no free port on 127.0.0.1")


def free_port_block(count: int) -> int:
    """A base port with `count` free ports after it (loopback), below the kernel's ephemeral range
    (32768-60999), where outgoing connections take their ports, and from a random start, so that two
    runs at once rarely probe the same block."""
    start = random.randrange(10000, 30000)
    for base in [*range(start, 32768 - count, 97), *range(10000, start, 97)]:
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port block on 127.0.0.1")
