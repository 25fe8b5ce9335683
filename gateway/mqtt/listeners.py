"""The MQTT listeners: plain TCP, TLS (``--mqtts-bind``) and WebSocket (``--ws-bind``,
subprotocol ``mqtt``, via the maintained ``websockets`` library). All three hand bytes to the
same MQTTConnection; WebSocket through a small transport adapter."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import sys
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.typing import Subprotocol
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidMessage
from websockets.http11 import Request, Response

from store import RateLimitedLog

from .. import lean_tcp
from ..config import Config, ConfigError
from ..listen import ListeningServer, Servers, listening_sockets
from .broker import MQTTBroker
from .connection import MQTTConnection

if TYPE_CHECKING:
    from ..trace import Tracer

log = logging.getLogger("tidemq.mqtt")


async def start_tcp(broker: MQTTBroker, host: str, port: int, tls: ssl.SSLContext | None = None,
                    tracer: Tracer | None = None) -> ListeningServer:
    """Plain TCP on lean_tcp's transports (an idle client costs ~0.9 KiB less than on
    asyncio's); TLS on asyncio's, which does the handshake and record layer."""
    if tls is None:
        return await lean_tcp.serve(lambda: MQTTConnection(broker, tracer), host, port)
    loop = asyncio.get_running_loop()
    return await Servers.serving(await listening_sockets(host, port), lambda sock: loop.create_server(
        lambda: MQTTConnection(broker, tracer), sock=sock, ssl=tls))


class _WebSocketTransport(asyncio.Transport):
    """Enough of asyncio.Transport for MQTTConnection over one WebSocket: writes become binary
    frames (sent in order by one task), reading pauses by not taking the next frame."""

    def __init__(self, ws: ServerConnection, conn: MQTTConnection) -> None:
        super().__init__()
        self._ws = ws
        self._conn = conn
        self._outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._reading = asyncio.Event()
        self._reading.set()
        self._closing = False
        self._buffered = 0
        self._high = 1 << 20
        self._paused = False
        self.sender = asyncio.get_running_loop().create_task(self._send_loop())

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self._ws.remote_address
        if name == "sockname":
            return self._ws.local_address
        if name == "socket":
            return None
        return default

    def write(self, data: bytes) -> None:  # type: ignore[override]  # (bytes only: MQTT packets)
        if self._closing:
            return
        self._buffered += len(data)
        self._outgoing.put_nowait(bytes(data))
        if not self._paused and self._buffered > self._high:
            self._paused = True
            self._conn.pause_writing()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is not None:
            self._high = high

    def get_write_buffer_size(self) -> int:
        return self._buffered

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._outgoing.put_nowait(None)  # after what is queued

    def abort(self) -> None:
        self._closing = True
        self.sender.cancel()
        asyncio.get_running_loop().create_task(self._ws.close())

    async def _send_loop(self) -> None:
        try:
            while True:
                data = await self._outgoing.get()
                if data is None:
                    break
                await self._ws.send(data)
                self._buffered -= len(data)
                if self._paused and self._buffered <= self._high // 4:
                    self._paused = False
                    self._conn.resume_writing()
        except ConnectionClosed:
            pass
        finally:
            await self._ws.close()

    async def wait_readable(self) -> None:
        await self._reading.wait()


class _LibraryLog(logging.LoggerAdapter):
    """The websockets library's own log lines: its per-connection INFO lines (open, closed,
    rejected) are DEBUG here, and its errors are rate-limited, one traceback per interval."""

    def __init__(self, limited: RateLimitedLog) -> None:
        super().__init__(logging.getLogger("tidemq.mqtt.websockets"), {})
        self.limited = limited

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if level < logging.ERROR:
            super().log(min(level, logging.DEBUG), msg, *args, **kwargs)
        elif self.isEnabledFor(level):
            exc = sys.exc_info()[1] if kwargs.get("exc_info") else None
            cause = f"{msg}: {type(exc).__name__}" if exc is not None else str(msg)
            self.limited.log(level, cause, "websocket library error", exc_info=kwargs.get("exc_info"))


class _HandshakeConnection(ServerConnection):
    """websockets' server connection, made cheap to refuse: a failed opening handshake is
    logged once per cause per interval without a traceback (a health check's bare connect and
    close, a malformed request), and the connection holds no reference cycle, so it is freed
    when it closes rather than by a full collection (the library keeps the handshake exception,
    whose traceback's frames hold the connection, and a logger adapter that holds it too)."""

    def __init__(self, *args: Any, library_log: _LibraryLog, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = self.protocol.logger = library_log  # one for all connections, holding none

    async def handshake(self, *args: Any, **kwargs: Any) -> None:
        try:
            await super().handshake(*args, **kwargs)
        except Exception as exc:  # returning: the server aborts a connection that is not open
            # a client that closes before our answer fails the library's send, whichever way (a
            # refusal is an InvalidHandshake, raised once its answer went, whoever closed then)
            peer_left = not isinstance(exc, InvalidHandshake) and (
                isinstance(exc, ConnectionClosed) or self.connection_lost_waiter.done())
            # (our _LibraryLog)
            _log_refused(self.logger.limited, exc, self.remote_address, peer_left)  # type: ignore[union-attr]
            self.protocol.handshake_exc = None
            _drop_tracebacks(exc)
            del exc


def _root(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _host(peer: Any) -> Any:
    return peer[0] if isinstance(peer, tuple) else peer


def _log_refused(limited: RateLimitedLog, exc: BaseException, peer: Any, peer_left: bool = False) -> None:
    root = _root(exc)
    host = _host(peer)
    if isinstance(root, EOFError) and isinstance(exc, InvalidMessage):  # connect and close: a health check
        limited.log(logging.DEBUG, "closed_before_request", "websocket closed before a handshake peer=%s", host)
    elif peer_left:  # a request, then a close before the answer: a health check too
        limited.log(logging.DEBUG, "closed_before_response", "websocket closed before the handshake's answer "
                    "peer=%s error=%s", host, json.dumps(f"{type(exc).__name__}: {exc}"))
    elif isinstance(exc, (InvalidHandshake, ConnectionError)):  # the client's mistake, or it left
        reason = json.dumps(str(root) if isinstance(exc, InvalidMessage) else str(exc))  # quoted, ASCII
        limited.log(logging.INFO, type(exc).__name__, "websocket handshake refused peer=%s reason=%s", host, reason)
    else:
        limited.log(logging.ERROR, type(exc).__name__, "websocket handshake failed peer=%s", host,
                    exc_info=(type(exc), exc, exc.__traceback__))


def _drop_tracebacks(exc: BaseException | None) -> None:
    """Tracebacks hold the frames of the handshake, whose locals hold the connection."""
    seen = 0
    while exc is not None and seen < 16:
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
        seen += 1


def _check_request(connection: ServerConnection, request: Request) -> Response | None:
    """Refuse what the library would answer with 500 (or not at all): header values that are
    not ASCII (RFC 9110 gives them no meaning; the library fails to encode them)."""
    for name, value in request.headers.raw_items():
        if not value.isascii() or not name.isascii():
            reason = f"header {name!a} is not ASCII"
            limited = connection.logger.limited  # type: ignore[union-attr]  # (our _LibraryLog)
            limited.log(logging.INFO, "NotASCII", "websocket handshake refused peer=%s reason=%s",
                        _host(connection.remote_address), json.dumps(reason))
            return connection.respond(HTTPStatus.BAD_REQUEST, reason + "\n")
    return None


async def start_websocket(broker: MQTTBroker, host: str, port: int, tracer: Tracer | None = None) -> Servers:
    settings = broker.settings

    async def handler(ws: ServerConnection) -> None:
        if ws.subprotocol != "mqtt":
            await ws.close(1002, "the subprotocol must be mqtt")
            return
        conn = MQTTConnection(broker, tracer)
        transport = _WebSocketTransport(ws, conn)
        conn.connection_made(transport)
        try:
            async for frame in ws:
                if isinstance(frame, str):  # MQTT over WebSocket is binary frames only
                    log.info("text frame on an MQTT WebSocket peer=%s", conn.peer)
                    break
                conn.data_received(frame)
                await transport.wait_readable()
                if conn.closed:
                    break
        except ConnectionClosed:
            pass
        finally:
            if not conn.closed:
                conn.connection_lost(None)
            transport.close()
            await transport.sender

    library_log = _LibraryLog(RateLimitedLog(log))

    def create_connection(*args: Any, **kwargs: Any) -> _HandshakeConnection:
        return _HandshakeConnection(*args, library_log=library_log, **kwargs)

    def start(sock: socket.socket) -> serve:
        return serve(handler, sock=sock, subprotocols=[Subprotocol("mqtt")], compression=None,
                     max_size=settings.max_packet_size + 8, logger=library_log,
                     # a client stopped in the middle of a frame cannot answer a ping: closed
                     ping_interval=settings.read_timeout_s, ping_timeout=settings.read_timeout_s,
                     create_connection=create_connection,  # type: ignore[arg-type]  # (a ServerConnection subclass)
                     process_request=_check_request)

    return await Servers.serving(await listening_sockets(host, port), start)
