"""gateway/lean_tcp.py: the plain TCP listener's transport behaves as asyncio's selector
transport (write buffering and flow control, close after the buffer drained, abort, EOF, a
reset peer, pause and resume reading, a failing protocol), over real sockets on asyncio's loop
and on uvloop; an idle connection keeps no buffer and no per-connection dict."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from gateway import lean_tcp
from gateway.lean_tcp import LeanTransport

TIMEOUT = 10.0


class Recorder(asyncio.Protocol):
    """Records what the transport tells it; answers b"ping" with b"pong"."""

    def __init__(self, fail_on: bytes | None = None) -> None:
        self.transport: LeanTransport | None = None
        self.received = bytearray()
        self.events: list[str] = []
        self.lost: asyncio.Future = asyncio.get_running_loop().create_future()
        self.fail_on = fail_on

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        if self.fail_on is not None and self.fail_on in data:
            raise RuntimeError("the protocol failed")
        self.received += data
        if self.received.endswith(b"ping"):
            self.transport.write(b"pong")  # type: ignore[union-attr]

    def eof_received(self) -> None:
        self.events.append("eof")

    def pause_writing(self) -> None:
        self.events.append("pause_writing")

    def resume_writing(self) -> None:
        self.events.append("resume_writing")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost.set_result(exc)


async def until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def serving(fail_on: bytes | None = None) -> tuple[lean_tcp.LeanServer, list[Recorder], int]:
    protocols: list[Recorder] = []

    def factory() -> Recorder:
        protocols.append(Recorder(fail_on))
        return protocols[-1]

    server = await lean_tcp.serve(factory, "127.0.0.1", 0)
    return server, protocols, server.sockets[0].getsockname()[1]


def run_on_both_loops(scenario: Callable[[], Awaitable[None]]) -> None:
    for factory in (asyncio.new_event_loop, uvloop.new_event_loop):
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(scenario())  # type: ignore[arg-type]


async def exchange_and_eof() -> None:
    server, protocols, port = await serving()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), TIMEOUT) == b"pong"
        [proto] = protocols
        transport = proto.transport
        assert isinstance(transport, LeanTransport) and not hasattr(transport, "__dict__")
        assert transport.get_extra_info("peername") == writer.get_extra_info("sockname")
        assert transport.get_extra_info("sockname") == ("127.0.0.1", port)
        assert transport.get_write_buffer_size() == 0 and transport._buffer is None  # idle: no buffer
        writer.write_eof()  # the client is done: eof_received (None: close) and connection_lost
        assert await asyncio.wait_for(proto.lost, TIMEOUT) is None
        assert proto.events == ["made", "eof", "lost"]
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""  # and the server closed its side
        assert transport.get_extra_info("peername") is None and transport.is_closing()
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


def test_data_both_ways_then_eof_on_asyncio_and_on_uvloop() -> None:
    run_on_both_loops(exchange_and_eof)


async def unread_writes_pause_then_drain() -> None:
    server, protocols, port = await serving()
    client = socket.create_connection(("127.0.0.1", port))
    try:
        await until(lambda: protocols, "the connection")
        [proto] = protocols
        transport = proto.transport
        assert transport is not None
        transport.set_write_buffer_limits(high=64 * 1024)
        assert transport.get_write_buffer_limits() == (16 * 1024, 64 * 1024)
        chunk = bytes(range(256)) * 256  # 64 KiB
        sent = 0
        while "pause_writing" not in proto.events:  # the client reads nothing: the socket fills
            transport.write(chunk)
            sent += len(chunk)
            assert sent < 1 << 30
        assert proto.events == ["made", "pause_writing"]
        assert transport.get_write_buffer_size() > 64 * 1024
        transport.close()  # what is buffered still goes out, then connection_lost
        assert not proto.lost.done()
        loop = asyncio.get_running_loop()
        client.setblocking(False)
        got = 0
        while True:
            data = await asyncio.wait_for(loop.sock_recv(client, 1 << 20), TIMEOUT)
            if not data:
                break
            got += len(data)
        assert got == sent
        assert await asyncio.wait_for(proto.lost, TIMEOUT) is None
        assert proto.events == ["made", "pause_writing", "resume_writing", "lost"]
    finally:
        client.close()
        server.close()


def test_unread_writes_pause_the_protocol_and_a_close_sends_them_before_the_end() -> None:
    run_on_both_loops(unread_writes_pause_then_drain)


async def test_paused_reading_reads_nothing_until_resumed() -> None:
    server, protocols, port = await serving()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await until(lambda: protocols, "the connection")
        [proto] = protocols
        proto.transport.pause_reading()  # type: ignore[union-attr]
        proto.transport.pause_reading()  # type: ignore[union-attr]  # (twice: still one pause)
        writer.write(b"ping")
        await writer.drain()
        await asyncio.sleep(0.2)
        assert proto.received == b""
        proto.transport.resume_reading()  # type: ignore[union-attr]
        assert await asyncio.wait_for(reader.readexactly(4), TIMEOUT) == b"pong"
        writer.close()
        assert await asyncio.wait_for(proto.lost, TIMEOUT) is None
    finally:
        server.close()


async def test_abort_drops_what_is_buffered_and_a_reset_peer_is_a_lost_connection() -> None:
    server, protocols, port = await serving()
    try:
        aborted = socket.create_connection(("127.0.0.1", port))
        await until(lambda: protocols, "the first connection")
        first = protocols[0]
        first.transport.pause_reading()  # type: ignore[union-attr]
        first.transport.abort()  # type: ignore[union-attr]
        assert await asyncio.wait_for(first.lost, TIMEOUT) is None
        first.transport.write(b"after the end")  # type: ignore[union-attr]  # dropped, no error
        aborted.close()

        reset = socket.create_connection(("127.0.0.1", port))
        await until(lambda: len(protocols) == 2, "the second connection")
        reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        reset.close()  # RST
        assert isinstance(await asyncio.wait_for(protocols[1].lost, TIMEOUT), ConnectionResetError)
    finally:
        server.close()


async def test_a_failing_protocol_closes_its_connection_is_reported_and_others_go_on() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    server, protocols, port = await serving(fail_on=b"boom")
    try:
        bad_reader, bad_writer = await asyncio.open_connection("127.0.0.1", port)
        bad_writer.write(b"boom")
        await until(lambda: protocols, "the connection")
        assert isinstance(await asyncio.wait_for(protocols[0].lost, TIMEOUT), RuntimeError)
        assert await asyncio.wait_for(bad_reader.read(), TIMEOUT) == b""
        [context] = reported
        assert context["message"] == "Fatal error: protocol.data_received() call failed."
        assert isinstance(context["exception"], RuntimeError)

        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), TIMEOUT) == b"pong"
        writer.close()
        bad_writer.close()
    finally:
        loop.set_exception_handler(None)
        server.close()


async def test_a_closed_server_accepts_no_more_and_its_connections_go_on() -> None:
    server, protocols, port = await serving()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await until(lambda: protocols, "the connection")
    server.close()
    await server.wait_closed()
    assert not server.is_serving() and server.sockets == ()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"ping")
    assert await asyncio.wait_for(reader.readexactly(4), TIMEOUT) == b"pong"
    writer.close()
    assert await asyncio.wait_for(protocols[0].lost, TIMEOUT) is None


async def test_a_busy_port_is_an_error_naming_the_address() -> None:
    server, _protocols, port = await serving()
    try:
        with pytest.raises(OSError, match=f"error while attempting to bind on address .*{port}"):
            await lean_tcp.serve(asyncio.Protocol, "127.0.0.1", port)
    finally:
        server.close()


async def test_out_of_descriptors_pauses_accepting_and_it_resumes() -> None:
    """Linux keeps reporting the listening socket readable while accept() fails with EMFILE:
    accepting pauses (reported once), and the waiting clients are accepted once it may again."""
    import os
    import resource

    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    server, protocols, port = await serving()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]  # before the limit
    try:
        lowest_free = os.dup(0)  # (a descriptor gets the lowest free number: none is free below the limit)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
        try:
            await until(lambda: reported, "the report")
            await asyncio.sleep(0.2)  # (the loop goes on: no busy loop, no second report)
            assert len(reported) == 1 and reported[0]["message"] == "socket.accept() out of system resource"
            assert not protocols
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        await until(lambda: len(protocols) == 3, "the three connections, accepted after the pause")
    finally:
        loop.set_exception_handler(None)
        for client in clients:
            client.close()
        server.close()
