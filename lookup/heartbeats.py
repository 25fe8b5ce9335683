"""The heartbeat loop both lookup backends run: one beat every interval until the lookup closes,
a failed beat logged and the next one tried (a bug in a beat must not stop them)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("tidemq.lookup")


async def beat_until_closed(closed: Callable[[], bool], interval_s: float, beat: Callable[[], Awaitable[None]],
                            node_id: str) -> None:
    while not closed():
        await asyncio.sleep(interval_s)
        try:
            await beat()
        except Exception:  # a bug here must not stop the heartbeats
            log.exception("lookup heartbeat failed node=%s", node_id)
