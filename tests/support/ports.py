"""Free TCP ports for the services a test starts."""

from __future__ import annotations

import socket

from streamops.local_stack.broker import free_port_pair

__all__ = ["free_port", "free_port_pair"]


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
