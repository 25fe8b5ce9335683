"""The embedded lookup's TCP transport: lookup requests as remoting commands (``lookup.link``)
on one connection per peer, replies matched by opaque. The address book (node id -> host, port)
is given, the same on every node. ``handle_command`` serves one command, so a remoting listener
of the gateway can pass ``LookupCode`` requests to it instead of running ``start``'s own."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Mapping

from protocols.remoting.codes import ResponseCode
from protocols.remoting.errors import RemotingProtocolError
from protocols.remoting.frames import (
    DEFAULT_MAX_FRAME,
    FrameReader,
    RemotingCommand,
    encode,
)

from . import link
from .transport import Handler, LookupUnavailable, Request

log = logging.getLogger("tidemq.lookup")
Address = tuple[str, int]


class TcpTransport:
    def __init__(self, node_id: str, host: str = "127.0.0.1", port: int = 0,
                 peers: Mapping[str, Address] | None = None, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.max_frame = max_frame
        self._peers: dict[str, Address] = dict(peers or {})
        self._links: dict[str, _PeerLink] = {}
        self._handler: Handler | None = None
        self._server: asyncio.Server | None = None
        self._served: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> Address:
        return (self.host, self.port)

    def add_peer(self, node_id: str, address: Address) -> None:
        if self._peers.get(node_id) != address:
            self._peers[node_id] = address
            old = self._links.pop(node_id, None)
            if old is not None:
                old.close()

    def bind(self, handler: Handler) -> None:
        self._handler = handler

    def peers(self) -> frozenset[str]:
        return frozenset(self._peers) | {self.node_id}

    async def start(self) -> None:
        """Listen (port 0: any free port, then ``port`` holds it)."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
            self.port = self._server.sockets[0].getsockname()[1]

    async def call(self, node_id: str, request: Request) -> Request:
        peer = self._links.get(node_id)
        if peer is None:
            address = self._peers.get(node_id)
            if address is None:
                raise LookupUnavailable(f"no address for node {node_id!r}")
            peer = self._links[node_id] = _PeerLink(address, self.max_frame)
        return await peer.request(request)

    async def close(self) -> None:
        for peer in self._links.values():
            peer.close()
        self._links.clear()
        if self._server is not None:
            self._server.close()
            for writer in list(self._served):
                writer.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def handle_command(self, command: RemotingCommand) -> RemotingCommand | None:
        """The reply to one remoting command (None for a stray response)."""
        if command.is_response:
            return None
        if not link.is_lookup_request(command):
            return link.error_command(command, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                      f"request code {command.code} is not served here")
        if self._handler is None:
            return link.error_command(command, ResponseCode.SYSTEM_BUSY, "the lookup is not running")
        try:
            reply = await self._handler(link.decode_request(command))
        except (RemotingProtocolError, KeyError, TypeError, ValueError) as exc:
            return link.error_command(command, ResponseCode.SYSTEM_ERROR, f"bad lookup request: {exc}")
        return link.reply_command(command, reply)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._served.add(writer)
        frames = FrameReader(self.max_frame)
        try:
            while data := await reader.read(65536):
                for command in frames.feed(data):
                    # one after the other: a peer's requests are applied in the order it sent them
                    reply = await self.handle_command(command)
                    if reply is not None:
                        writer.write(encode(reply))
                await writer.drain()
        except RemotingProtocolError as exc:
            log.warning("lookup link closed: bad frame node=%s error=%s", self.node_id, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._served.discard(writer)
            writer.close()


class _PeerLink:
    """One connection to a peer, opened on first use and again after it is lost."""

    def __init__(self, address: Address, max_frame: int) -> None:
        self._address = address
        self._max_frame = max_frame
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._opaque = itertools.count(1)
        self._connecting = asyncio.Lock()

    async def request(self, request: Request) -> Request:
        writer = await self._connected()
        opaque = next(self._opaque) & 0x7FFFFFFF
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[opaque] = future
        try:
            writer.write(encode(link.request_command(request, opaque)))
            reply = await future
        finally:
            self._pending.pop(opaque, None)
        try:
            return link.decode_reply(reply)
        except link.LookupLinkError as exc:  # the peer cannot serve it: as good as unreachable
            raise LookupUnavailable(str(exc)) from None

    async def _connected(self) -> asyncio.StreamWriter:
        async with self._connecting:  # FIFO: requests keep their order through a reconnect
            if self._writer is None or self._writer.is_closing():
                reader, self._writer = await asyncio.open_connection(*self._address)
                self._reader_task = asyncio.create_task(self._read(reader, self._writer))
            return self._writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader(self._max_frame)
        error: Exception = LookupUnavailable(f"connection to {self._address} closed")
        try:
            while data := await reader.read(65536):
                for command in frames.feed(data):
                    future = self._pending.pop(command.opaque, None)
                    if future is not None and not future.done():
                        future.set_result(command)
        except (OSError, RemotingProtocolError) as exc:
            error = LookupUnavailable(f"connection to {self._address} failed: {exc}")
        finally:
            writer.close()
            if self._writer is writer:
                self._writer = None
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)
            self._pending.clear()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
