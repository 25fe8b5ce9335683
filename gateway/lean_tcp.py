"""The plain TCP listeners (MQTT, AMQP, remoting), whose connections cost little while idle:
per connection, one slotted transport and the accepted socket. asyncio's selector transport
also keeps an extra-info dict with a TransportSocket and the peer and socket names, a weak
registry entry, its accept task's future, a write buffer and two bound methods, which this
transport does without (BENCHMARKS.md: idle connections).

The transport behaves as asyncio's ``_SelectorSocketTransport`` (send at once, buffer the rest,
pause_writing above the high-water mark, close once the buffer drained, abort, EOF, fatal
errors reported to the loop's exception handler), through the loop's public
add_reader/add_writer, so it runs on asyncio's loop and on uvloop alike. Plain TCP only: TLS
listeners keep asyncio's transports."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

from .listen import ListeningServer, listening_sockets

log = logging.getLogger("tidemq.tcp")

READ_SIZE = 256 * 1024  # as asyncio's: one recv() per readiness, freed after data_received
WRITE_HIGH = 64 * 1024  # asyncio's default write buffer limits
WRITE_LOW = WRITE_HIGH // 4
ACCEPT_RETRY_S = 1.0  # out of file descriptors: accepting pauses this long (asyncio's delay)
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_WRITES_AFTER_LOSS_LOGGED = 5  # as asyncio's: writes to a lost connection are logged from the 5th


class LeanTransport(asyncio.Transport):
    # No __dict__, no extra-info dict (BaseTransport's _extra slot stays unset: get_extra_info
    # asks the socket), no write buffer until a write does not go out at once, and the socket's
    # descriptor asked of it, not kept (an int above 256 is an object per connection).
    __slots__ = ("_buffer", "_closing", "_conn_lost", "_high", "_loop", "_low", "_protocol", "_reading", "_sock",
                 "_writing_paused")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: asyncio.Protocol) -> None:
        self._loop = loop
        self._sock: socket.socket | None = sock
        self._protocol: Any = protocol
        self._buffer: bytearray | None = None  # what waits for the socket; None when nothing does
        self._closing = False
        self._conn_lost = 0  # connection_lost scheduled (then: writes attempted since)
        self._reading = True
        self._writing_paused = False
        self._high = WRITE_HIGH
        self._low = WRITE_LOW

    def __repr__(self) -> str:
        state = "closed" if self._sock is None else "closing" if self._closing else "open"
        fd = self._sock.fileno() if self._sock is not None else -1
        return f"<LeanTransport fd={fd} {state} buffered={self.get_write_buffer_size()}>"

    # -- asyncio.BaseTransport -------------------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``socket``, ``peername`` and ``sockname``, asked of the socket when wanted (not
        kept: an idle connection would hold them for nothing); ``default`` once it is closed."""
        sock = self._sock
        if sock is None:
            return default
        if name == "socket":
            return sock
        try:
            if name == "peername":
                return sock.getpeername()
            if name == "sockname":
                return sock.getsockname()
        except OSError:
            return default
        return default

    def is_closing(self) -> bool:
        return self._closing

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def close(self) -> None:
        """Stop reading; connection_lost once what is buffered has been sent."""
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd())
        if self._buffer is None:
            self._conn_lost += 1
            self._loop.call_soon(self._call_connection_lost, None)

    # -- reading -------------------------------------------------------------------------------
    def is_reading(self) -> bool:
        return self._reading and not self._closing

    def pause_reading(self) -> None:
        if self.is_reading():
            self._reading = False
            self._loop.remove_reader(self._fd())

    def resume_reading(self) -> None:
        if not self._closing and not self._reading:
            self._reading = True
            self._loop.add_reader(self._fd(), LeanTransport._read_ready, self)

    def _read_ready(self) -> None:
        if self._conn_lost:
            return
        try:
            data = self._sock.recv(READ_SIZE)  # type: ignore[union-attr]  # (None only once _conn_lost)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 -- as asyncio: it ends this connection, not the loop
            self._fatal_error(exc, "Fatal read error on socket transport")
            return
        try:
            if data:
                self._protocol.data_received(data)
                return
            keep_open = self._protocol.eof_received()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 -- as asyncio: it ends this connection, not the loop
            what = "data_received" if data else "eof_received"
            self._fatal_error(exc, f"Fatal error: protocol.{what}() call failed.")
            return
        if keep_open:  # the protocol may still write; nothing more can be read
            self._loop.remove_reader(self._fd())
        else:
            self.close()

    # -- writing -------------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data argument must be a bytes-like object, not {type(data).__name__!r}")
        if not data:
            return
        if self._conn_lost:
            if self._conn_lost >= _WRITES_AFTER_LOSS_LOGGED:
                log.warning("socket.send() raised exception.")
            self._conn_lost += 1
            return
        if self._buffer is None:
            try:  # nothing waits: straight to the socket
                sent = self._sock.send(data)  # type: ignore[union-attr]  # (None only once _conn_lost)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:  # noqa: BLE001 -- as asyncio: it ends this connection, not the loop
                self._fatal_error(exc, "Fatal write error on socket transport")
                return
            if sent == len(data):
                return
            self._buffer = bytearray(memoryview(data)[sent:])
            self._loop.add_writer(self._fd(), self._write_ready)
        else:
            self._buffer += data
        self._maybe_pause_protocol()

    def _write_ready(self) -> None:
        buffer = self._buffer
        if self._conn_lost or buffer is None:
            return
        try:
            sent = self._sock.send(buffer)  # type: ignore[union-attr]  # (None only once _conn_lost)
        except (BlockingIOError, InterruptedError):
            return
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 -- as asyncio: it ends this connection, not the loop
            self._loop.remove_writer(self._fd())
            self._buffer = None
            self._fatal_error(exc, "Fatal write error on socket transport")
            return
        if sent:
            del buffer[:sent]
        self._maybe_resume_protocol()  # (which may write more)
        if not buffer:
            self._buffer = None  # an idle connection keeps no buffer
            self._loop.remove_writer(self._fd())
            if self._closing:
                self._conn_lost += 1
                self._call_connection_lost(None)

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return len(self._buffer) if self._buffer is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = WRITE_HIGH if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._maybe_pause_protocol()

    def _maybe_pause_protocol(self) -> None:
        if self._writing_paused or self.get_write_buffer_size() <= self._high:
            return
        self._writing_paused = True
        self._flow_control("pause_writing")

    def _maybe_resume_protocol(self) -> None:
        if self._writing_paused and self.get_write_buffer_size() <= self._low:
            self._writing_paused = False
            self._flow_control("resume_writing")

    def _flow_control(self, name: str) -> None:
        try:
            getattr(self._protocol, name)()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 -- as asyncio: reported, the connection goes on
            self._loop.call_exception_handler({"message": f"protocol.{name}() failed", "exception": exc,
                                               "transport": self, "protocol": self._protocol})

    # -- the end -------------------------------------------------------------------------------
    def abort(self) -> None:
        self._force_close(None)

    def _fatal_error(self, exc: BaseException, message: str) -> None:
        if not isinstance(exc, OSError):  # (a reset peer is ordinary; a bug in the protocol is not)
            self._loop.call_exception_handler({"message": message, "exception": exc, "transport": self,
                                               "protocol": self._protocol})
        self._force_close(exc)  # type: ignore[arg-type]  # (connection_lost takes it as asyncio does)

    def _force_close(self, exc: Exception | None) -> None:
        if self._conn_lost:
            return
        if self._buffer is not None:
            self._buffer = None
            self._loop.remove_writer(self._fd())
        if not self._closing:
            self._closing = True
            self._loop.remove_reader(self._fd())
        self._conn_lost += 1
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: Exception | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            if self._sock is not None:
                self._sock.close()
            self._sock = None
            self._protocol = None

    def _fd(self) -> int:
        return self._sock.fileno()  # type: ignore[union-attr]  # (None only once _conn_lost)


class LeanServer(ListeningServer):
    """The listening sockets and their accept callbacks. Its connections are their protocols'
    to close (the brokers say goodbye to their clients on shutdown): ``wait_closed`` returns
    once the listening sockets are closed, as asyncio's Server does on Python 3.11."""

    def __init__(self, loop: asyncio.AbstractEventLoop, factory: Callable[[], asyncio.Protocol],
                 sockets: list[socket.socket], backlog: int) -> None:
        self._loop = loop
        self._factory = factory
        self._sockets = sockets
        self._backlog = backlog
        for sock in sockets:
            self._listen(sock)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return bool(self._sockets)

    async def start_serving(self) -> None:
        return None  # (serving from creation)

    def close(self) -> None:
        sockets, self._sockets = self._sockets, []
        for sock in sockets:
            self._loop.remove_reader(sock.fileno())
            sock.close()

    async def wait_closed(self) -> None:
        return None

    async def serve_forever(self) -> None:
        raise NotImplementedError  # (as asyncio.AbstractServer's: the gateway awaits its own shutdown)

    def _listen(self, sock: socket.socket) -> None:
        if sock in self._sockets:  # (not closed while accepting paused)
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, listening: socket.socket) -> None:
        # up to backlog connections per readiness, as asyncio (bpo-27906)
        for _ in range(self._backlog):
            try:
                sock, _peer = listening.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise  # (the loop logs it and goes on)
                # Linux keeps reporting the socket readable: stop asking for a while
                self._loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                                   "exception": exc, "socket": listening})
                self._loop.remove_reader(listening.fileno())
                self._loop.call_later(ACCEPT_RETRY_S, self._listen, listening)
                return
            self._connection(sock)

    def _connection(self, sock: socket.socket) -> None:
        protocol: asyncio.Protocol | None = None
        try:
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):  # small writes go out at once
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            protocol = self._factory()
            transport = LeanTransport(self._loop, sock, protocol)
            protocol.connection_made(transport)
            if transport.is_reading():  # (unless connection_made paused or closed it)
                # (the function and the transport as its argument: the handle keeps a 1-tuple,
                # 16 bytes less than a bound method, as long as the connection lives)
                self._loop.add_reader(sock.fileno(), LeanTransport._read_ready, transport)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 -- reported; this socket is closed, others go on
            self._loop.call_exception_handler({"message": "Error on transport creation for incoming connection",
                                               "exception": exc, "protocol": protocol})
            sock.close()


async def serve(factory: Callable[[], asyncio.Protocol], host: str, port: int, *,
                backlog: int = 100) -> LeanServer:
    """Listen on the sockets of ``host`` and ``port`` (gateway/listen.py: ``localhost`` is both
    loopbacks)."""
    sockets = await listening_sockets(host, port, backlog=backlog)
    return LeanServer(asyncio.get_running_loop(), factory, sockets, backlog)
