"""Free TCP ports on the loopback interface, for the rendezvous of process groups.

    port = free_port(29600)   # 29600 if nothing listens there, else any free port
"""

from __future__ import annotations

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
