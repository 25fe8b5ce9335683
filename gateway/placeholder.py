"""A listener for a protocol that this build does not serve yet.

It binds the configured address (so port conflicts and the CLI contract show up now),
logs each connection and closes it. Each protocol issue replaces it with the real server.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("tidemq.gateway.placeholder")


def placeholder_handler(protocol: str):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        log.info("connection refused: protocol not served yet protocol=%s peer=%s", protocol, _addr(peer))
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass

    return handle


def _addr(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
