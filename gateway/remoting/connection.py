"""One remoting connection: an asyncio Protocol that feeds the sans-IO frame reader, hands
each request to the broker (each in its own task: a held pull must not stop the sends behind
it), writes the responses, and sends the broker's own requests to the client (one-way
NOTIFY_CONSUMER_IDS_CHANGED). A malformed or oversized frame closes only this connection."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING

from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.errors import RemotingProtocolError
from protocols.remoting.frames import (
    FLAG_ONEWAY,
    FrameReader,
    RemotingCommand,
    encode,
    response_to,
)

if TYPE_CHECKING:
    from .broker import RemotingBroker

log = logging.getLogger("tidemq.remoting")

_opaques = itertools.count(1)


class RemotingConnection(asyncio.Protocol):
    def __init__(self, broker: RemotingBroker, *, max_frame_size: int) -> None:
        self.broker = broker
        self.reader = FrameReader(max_frame_size=max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.client_id = ""
        self.closed = False
        self._tasks: set[asyncio.Task[None]] = set()

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else ""
        self.broker.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            commands = self.reader.feed(data)
        except RemotingProtocolError as exc:
            log.info("remoting bad frame, closing peer=%s error=%s", self.peer, exc)
            self.close()
            return
        loop = asyncio.get_running_loop()
        for command in commands:
            if command.is_response:
                continue  # answers to our one-way notifications: none are expected
            task = loop.create_task(self._serve(command))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.broker.connections.discard(self)
        self.broker.groups.connection_closed(self)
        for task in self._tasks:
            task.cancel()

    # -- requests ------------------------------------------------------------------------------
    async def _serve(self, request: RemotingCommand) -> None:
        try:
            response = await self.broker.handle(self, request)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("remoting request failed code=%d peer=%s", request.code, self.peer)
            response = response_to(request, ResponseCode.SYSTEM_ERROR, "internal error")
        if response is not None and not request.is_oneway:
            self.send(response)

    def send(self, command: RemotingCommand) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(encode(command))

    def notify_consumer_ids_changed(self, group: str) -> None:
        self.send(RemotingCommand(code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=next(_opaques),
                                  flag=FLAG_ONEWAY, ext_fields={"consumerGroup": group}))

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
