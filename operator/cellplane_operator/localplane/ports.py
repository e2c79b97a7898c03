"""Free loopback ports for the processes of one local control plane.

A port is taken by binding to port 0 and released just before the program binds
it. Ports handed out in this process are remembered, so two members started in
the same test never get the same one, even before either has bound.
"""

from __future__ import annotations

import socket
import threading

__all__ = ["LOOPBACK", "free_port"]

LOOPBACK = "127.0.0.1"

_handed_out: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = LOOPBACK) -> int:
    with _lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError("no free loopback port after 100 tries")
