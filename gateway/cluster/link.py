"""A client connection of the remoting protocol between TideMQ nodes: requests matched to
their responses by opaque, one-way requests both ways, and requests the other side starts
(handed to ``on_request``). Frames are ``protocols.remoting.frames``; nothing here knows what
the requests mean."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from protocols.remoting.errors import RemotingProtocolError
from protocols.remoting.frames import (
    FLAG_ONEWAY,
    FrameReader,
    RemotingCommand,
    encode,
    response_to,
)

log = logging.getLogger("tidemq.cluster")

DEFAULT_TIMEOUT_S = 10.0


class LinkClosed(ConnectionError):
    """The link is down: the request was not answered (it may or may not have been done)."""


class Link(asyncio.Protocol):
    def __init__(self, name: str, on_request: Callable[[RemotingCommand], None] | None = None,
                 max_frame_size: int = 64 << 20) -> None:
        self.name = name
        self.on_request = on_request
        self._reader = FrameReader(max_frame_size=max_frame_size)
        self._transport: asyncio.Transport | None = None
        self._waiting: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._opaques = itertools.count(1)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.closed = asyncio.get_running_loop().create_future()  # resolves when the link is down

    @classmethod
    async def connect(cls, host: str, port: int, name: str = "link",
                      on_request: Callable[[RemotingCommand], None] | None = None) -> Link:
        loop = asyncio.get_running_loop()
        _, link = await loop.create_connection(lambda: cls(name, on_request), host, port)
        return link

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self.closed.done()

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # (a Transport: a TCP connection's)

    def data_received(self, data: bytes) -> None:
        try:
            commands = self._reader.feed(data)
        except RemotingProtocolError as exc:
            log.error("bad frame on a node link, closing link=%s error=%s", self.name, exc)
            self.close()
            return
        for command in commands:
            if command.is_response:
                waiter = self._waiting.pop(command.opaque, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(command)
            elif self.on_request is not None:
                self.on_request(command)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self.closed.done():
            self.closed.set_result(None)
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(LinkClosed(f"node link {self.name} closed"))

    # -- requests -----------------------------------------------------------------------------
    def request(self, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"") -> asyncio.Future[
            RemotingCommand]:
        """Send a request now (written at the end of this turn of the loop); the future gets
        the response, or LinkClosed."""
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        if not self.is_open:
            future.set_exception(LinkClosed(f"node link {self.name} is closed"))
            return future
        opaque = next(self._opaques)
        self._waiting[opaque] = future
        future.add_done_callback(lambda _: self._waiting.pop(opaque, None))  # (also when given up)
        self._write(RemotingCommand(code, opaque, ext_fields=ext_fields or {}, body=body))
        return future

    async def call(self, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"",
                   timeout: float = DEFAULT_TIMEOUT_S) -> RemotingCommand:
        future = self.request(code, ext_fields, body)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            future.cancel()
            raise

    def oneway(self, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"") -> None:
        if not self.is_open:
            raise LinkClosed(f"node link {self.name} is closed")
        self._write(RemotingCommand(code, next(self._opaques), FLAG_ONEWAY, ext_fields=ext_fields or {}, body=body))

    def respond(self, request: RemotingCommand, code: int, ext_fields: dict[str, str] | None = None) -> None:
        """Answer a request the other side sent."""
        if self.is_open:
            self._write(response_to(request, code, ext_fields=ext_fields))

    def _write(self, command: RemotingCommand) -> None:
        self._out.append(encode(command))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None:
            self._transport.write(b"".join(self._out))
        self._out.clear()

    def close(self) -> None:
        """Close after writing what was sent (one-way requests included)."""
        self._flush()
        if self._transport is not None:
            self._transport.close()
