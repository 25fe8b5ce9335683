"""AMQP on a gateway node: each client connection relayed, byte for byte, to the store node's
AMQP listener.

An AMQP queue's consumers compete for its messages, with acknowledgements, requeues, prefetch
and exclusive consumers kept per queue: that state must live in one place, or two nodes would
hand the same message to two consumers. So a gateway node does not run an AMQP broker of its
own; it accepts AMQP clients where devices and apps expect them and relays each connection to
the store node, whose broker serves them as its own (RabbitMQ's clients behind a TCP load
balancer see the same). What a relay adds is one copy per direction in this process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ..listen import ListeningServer, Servers, listening_sockets

log = logging.getLogger("tidemq.cluster")

CHUNK = 1 << 16


async def start_relay(host: str, port: int,
                      target: Callable[[], Awaitable[tuple[str, int]]]) -> ListeningServer:
    """``target()``: the store node's AMQP address now (a replicated store's leader changes)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            address = await target()
            up_reader, up_writer = await asyncio.open_connection(*address)
        except OSError as exc:
            log.warning("relay: store node unreachable peer=%s error=%s", peer, exc)
            writer.close()
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()

    return await Servers.serving(await listening_sockets(host, port), lambda sock: asyncio.start_server(serve, sock=sock))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until one side ends; ``drain`` holds the reader back while the writer is behind."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        if writer.can_write_eof():
            try:
                writer.write_eof()
            except (ConnectionError, OSError):
                writer.close()
        else:
            writer.close()
