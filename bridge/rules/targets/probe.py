"""Whether a target that refused connections listens again: a TCP connection to its address,
tried every ``PROBE_S`` and closed at once, unused. A rule waiting out its backoff after such a
failure retries as soon as this returns (runner.py)."""

from __future__ import annotations

import asyncio

PROBE_S = 0.5


async def until_listening(host: str, port: int) -> None:
    """Return once ``host``:``port`` takes a TCP connection (the caller cancels it to give up)."""
    while True:
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(PROBE_S)
            continue
        writer.close()
        return


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from, as client libraries wrap it) is a refused
    connection: the target's address has nothing listening."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, ConnectionRefusedError):
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False
