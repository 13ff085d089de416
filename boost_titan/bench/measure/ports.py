"""A free TCP port for the rendezvous of a process group spawned on this host."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that no socket holds now (the OS picks it); pass it as
    MASTER_PORT to the processes of one local gloo group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
