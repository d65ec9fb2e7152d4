"""A listening socket inside another process's network namespace: how the egress proxy reaches a sandbox
whose network holds nothing else.

setns(2) with CLONE_NEWNET moves only the calling thread, and a socket stays in the namespace it was
made in. So a thread of its own enters the sandbox's namespace (that of process `pid`: a process
sandbox's namespace holder, a container's init), binds 127.0.0.1:port there and ends; the socket it
made serves on the proxy's event loop, whose own thread never left the node's namespace. Needs root
(CAP_SYS_ADMIN over the namespace), as dockerd does. Python 3.11 has no os.setns: libc's, by ctypes.

Test: tests/egress/test_egress_sandboxes.py.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(OSError):
    """The namespace could not be entered, or nothing could listen there."""


def listen_in(pid: int, port: int) -> socket.socket:
    """A non-blocking socket listening on 127.0.0.1:`port` in the network namespace of process `pid`."""
    made: dict = {}

    def enter_and_listen() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            made["error"] = NetnsError(f"no network namespace of process {pid}: {e.strerror}")
            return
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                made["error"] = NetnsError(f"cannot enter the network namespace of process {pid}: "
                                           f"{os.strerror(errno)} (the egress proxy must run as root)")
                return
        finally:
            os.close(fd)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            made["error"] = NetnsError(f"cannot listen on 127.0.0.1:{port} in process {pid}'s namespace: {e}")
            return
        made["socket"] = sock
        # The thread ends here, still in the sandbox's namespace: no thread that runs anything else ever was.

    thread = threading.Thread(target=enter_and_listen, name="rl360-egress-setns")
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    return made["socket"]
