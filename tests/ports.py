"""Loopback ports for the servers tests start, one place for every helper.

Picked below the kernel's ephemeral range: a port is often bound seconds after its pick (a
replicated store node opens its listeners only once elected), and an outgoing connection made
meanwhile -- a client's, a replica's, etcd's -- could otherwise be given it as its local port.
Never handed out twice in one test process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

LOWEST = 10000


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _span() -> tuple[int, int]:
    low, high = _ephemeral_range()
    if low - LOWEST >= 2000:
        return LOWEST, low
    return high + 1, 65536  # (a wide ephemeral range: above it)


_FIRST, _END = _span()
_next = _FIRST + os.getpid() % max(1, _END - _FIRST)


def free_port() -> int:
    """A port free on 127.0.0.1 now, outside the ephemeral range, not given before."""
    global _next
    size = _END - _FIRST
    for _ in range(size):
        port = _next
        _next = _FIRST + (_next + 1 - _FIRST) % size
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port in {_FIRST}..{_END - 1}")


def free_ports(count: int) -> list[int]:
    return [free_port() for _ in range(count)]
