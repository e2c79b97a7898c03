"""A TCP relay from the machine's loopback into one of the cluster's namespaces.

How the test machine's clients (kubectl, the project's Kubernetes client, pytest)
reach the apiserver, whose address exists only inside the cluster's namespaces:
this process binds ``127.0.0.1:<port>`` while it is still in the machine's
namespace, then joins the control plane's namespace (setns), and connects every
accepted connection to the apiserver from there. A listening socket keeps the
namespace it was made in, so the machine gains one loopback listener and nothing
else: no address, no route, no rule. TLS passes through untouched.

    python -m cellplane_operator.localplane.relay PORT NETNS_PATH HOST:PORT
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
from collections.abc import Sequence

__all__ = ["main"]

_CLONE_NEWNET = 0x40000000


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def _serve(listener: socket.socket, host: str, port: int) -> None:
    async def handle(client_reader: asyncio.StreamReader,
                     client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), timeout=10)
        except (OSError, asyncio.TimeoutError):
            client_writer.close()
            return
        try:
            await asyncio.gather(_pump(client_reader, upstream_writer),
                                 _pump(upstream_reader, client_writer))
        finally:
            for writer in (client_writer, upstream_writer):
                writer.close()

    server = await asyncio.start_server(handle, sock=listener)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print("usage: relay PORT NETNS_PATH HOST:PORT", file=sys.stderr)
        return 2
    listen_port, netns, target = int(args[0]), args[1], args[2]
    host, _, target_port = target.rpartition(":")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", listen_port))
    listener.listen(128)
    listener.setblocking(False)
    # From here on every new socket is made in the cluster's namespace.
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(netns, os.O_RDONLY)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        print(f"relay: setns {netns}: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 1
    os.close(fd)
    print(f"relay: 127.0.0.1:{listen_port} (machine) -> {target} (in {netns})", flush=True)
    asyncio.run(_serve(listener, host, int(target_port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
