"""Free TCP ports for the services a test starts.

Ports are taken from a range below the kernel's ephemeral ports (32768 and up here), so no
outgoing connection can take one between the choice and the service's bind; under pytest-xdist
each test process has a range of its own, so two processes never choose the same port. Within a
process the choice moves on through its range, so a port released a moment ago is not chosen again
at once."""

from __future__ import annotations

import os
import random
import re
import socket
import threading

FIRST, LAST = 20000, 32000  # below /proc/sys/net/ipv4/ip_local_port_range's 32768
WORKERS = 4  # ranges for up to this many test processes (gw0..gw3)

_lock = threading.Lock()


def _range() -> range:
    worker = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    if worker is None:
        return range(FIRST, LAST)
    size = (LAST - FIRST) // WORKERS
    start = FIRST + (int(worker[1]) % WORKERS) * size
    return range(start, start + size)


_ports = _range()
_position = [random.randrange(len(_ports))]  # a random start: two runs one after the other differ


def _free(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port nothing listens on now, from this process's range."""
    return _next(1)


def free_port_pair() -> int:
    """A port p with p and p+1 both free now (the broker puts its controller on p+1)."""
    return _next(2)


def _next(count: int) -> int:
    """`count` adjacent free ports; the next call starts after them (a pair's second port is
    the broker's controller: never handed out again as a port of its own)."""
    with _lock:
        for _ in range(len(_ports)):
            port = _ports[_position[0] % len(_ports)]
            _position[0] += 1
            if port + count - 1 < _ports.stop and all(_free(p) for p in range(port, port + count)):
                _position[0] += count - 1
                return port
    raise RuntimeError(f"no {count} adjacent free port(s) in {_ports.start}-{_ports.stop - 1}")
