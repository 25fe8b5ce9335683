"""The MQTT listeners: plain TCP, TLS (``--mqtts-bind``) and WebSocket (``--ws-bind``,
subprotocol ``mqtt``, via the maintained ``websockets`` library). All three hand bytes to the
same MQTTConnection; WebSocket through a small transport adapter."""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from ..config import Config, ConfigError
from .broker import MQTTBroker
from .connection import MQTTConnection

if TYPE_CHECKING:
    from ..trace import Tracer

log = logging.getLogger("tidemq.mqtt")


async def start_tcp(broker: MQTTBroker, host: str, port: int, tls: ssl.SSLContext | None = None,
                    tracer: Tracer | None = None) -> asyncio.Server:
    return await asyncio.get_running_loop().create_server(lambda: MQTTConnection(broker, tracer), host, port,
                                                          ssl=tls)


def tls_context(cfg: Config) -> ssl.SSLContext:
    """The server context of the TLS listener; a certificate or key that cannot be used is a
    ConfigError naming the setting and the file (ssl's own errors name neither)."""
    for name in ("tls_cert_file", "tls_key_file"):
        path = getattr(cfg, name)
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"{name}: cannot read {path!r}: {exc.strerror or exc}") from None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
    except ssl.SSLError as exc:
        raise ConfigError(f"tls_cert_file {cfg.tls_cert_file!r} and tls_key_file {cfg.tls_key_file!r}: "
                          f"not a PEM certificate chain and its private key ({exc.reason or exc})") from None
    return ctx


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
        if name == "socket":
            return None
        return default

    def write(self, data: bytes) -> None:  # type: ignore[override]
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


async def start_websocket(broker: MQTTBroker, host: str, port: int, tracer: Tracer | None = None) -> Server:
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

    return await serve(handler, host, port, subprotocols=["mqtt"], compression=None,
                       max_size=settings.max_packet_size + 8, ping_interval=None)
