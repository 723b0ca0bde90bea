"""Free TCP ports for SGLang servers, none handed out twice by one process."""

from __future__ import annotations

import socket

#: Ports this process handed out: a server binds its port only after seconds of
#: imports, and a prefetched one starts meanwhile, so none is handed out twice.
_HANDED_OUT: set[int] = set()


#: Highest port handed out: sglang 0.5.12 derives its gRPC port as ``port + 10000``
#: and refuses to start when that exceeds 65535 (``srt/server_args.py``).
MAX_PORT = 65535 - 10000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``, at most :data:`MAX_PORT`,
    and that this process has not handed out before."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port > MAX_PORT:
            port = _free_low_port(host)
        if port and port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise OSError("no free TCP port this process has not used before")


def _free_low_port(host: str) -> int:
    """A free port in ``[20000, MAX_PORT]`` (0 when a random pick is taken)."""
    import random

    port = random.randint(20000, MAX_PORT)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return 0
    return port
