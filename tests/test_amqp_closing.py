"""AMQP connection lifecycle (issues 18 and 23): a client that still writes after close-ok,
nothing buffered and one close sent after a connection error, the client's frame_max held to,
connection.update-secret, AMQPLAIN. Raw frames, aio-pika and py-amqp over real sockets."""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path

import aio_pika
import amqp
import pytest
from pamqp import commands

from gateway.auth import PasswordFile
from protocols.amqp.frames import HEARTBEAT_FRAME, method_frame

from .amqp_support import RawAMQP, port_of
from .test_amqp import amqp_gateway

TIMEOUT = 5.0


async def _eventually(check, timeout: float = TIMEOUT) -> None:
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


async def test_the_client_may_write_after_close_ok(data_dir: Path) -> None:
    """As RabbitMQ: after close-ok the server reads (and drops) until the client closes, so a
    client still writing meets no EPIPE and its close resolves."""
    async with amqp_gateway(data_dir) as (gw, url):
        raw = await RawAMQP.open(port_of(url))
        raw.writer.write(method_frame(0, commands.Connection.Close(200, "bye", 0, 0)))
        await raw.until(commands.Connection.CloseOk)
        for _ in range(10):  # frames already on their way when close-ok arrived
            raw.writer.write(HEARTBEAT_FRAME + method_frame(1, commands.Basic.Qos(prefetch_count=1)))
            await raw.writer.drain()
            await asyncio.sleep(0.03)
        with pytest.raises(TimeoutError):  # the server has not closed the socket on us
            await asyncio.wait_for(raw.reader.read(1), 0.3)
        raw.writer.close()
        await _eventually(lambda: not gw.amqp.connections)


async def test_after_a_connection_error_nothing_is_buffered_and_one_close_is_sent(
        data_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A frame header announcing 300 MB: connection.close 501 at once (the payload is not
    awaited), sent once and logged once however much follows; what follows is dropped unread
    (the reader's buffer stays small), and the socket is closed within the close timeout."""
    caplog.set_level(logging.INFO, logger="tidemq.amqp")
    async with amqp_gateway(data_dir) as (gw, url):
        raw = await RawAMQP.open(port_of(url))
        conn = next(iter(gw.amqp.connections))
        raw.writer.write(struct.pack(">BHI", 1, 1, 300_000_000))
        frames = await raw.until(commands.Connection.Close)
        assert frames[-1].reply_code == 501 and "frame_max" in frames[-1].reply_text
        chunk = bytes(range(256)) * 1024
        largest, sent = 0, 0
        try:
            for _ in range(128):  # 32 MiB after the close
                raw.writer.write(chunk)
                await raw.writer.drain()
                sent += len(chunk)
                largest = max(largest, conn.reader.buffered)
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed by the server's timeout while we were still sending
        assert sent >= 1 << 20 and largest <= 1 << 20, (sent, largest)
        rest = b""
        while chunk_in := await asyncio.wait_for(raw.reader.read(1 << 16), TIMEOUT):
            rest += chunk_in
        assert rest == b""  # no second connection.close
        errors = [r for r in caplog.records if "amqp connection error" in r.getMessage()]
        assert len(errors) == 1
        await _eventually(lambda: not gw.amqp.connections)


async def test_frame_max_lowered_by_the_client_is_held_to(data_dir: Path) -> None:
    async with amqp_gateway(data_dir) as (_, url):
        raw = await RawAMQP.open(port_of(url), frame_max=4096)
        raw.writer.write(method_frame(1, commands.Channel.Open()))
        await raw.until(commands.Channel.OpenOk)
        big = method_frame(1, commands.Queue.Declare(queue="q", arguments={"x-pad": "p" * 5000}))
        assert len(big) > 4096
        raw.writer.write(big)
        frames = await raw.until(commands.Connection.Close)
        assert frames[-1].reply_code == 501 and "4096" in frames[-1].reply_text
        assert not any(isinstance(f, commands.Queue.DeclareOk) for f in frames)
        raw.writer.close()


def _password_file(tmp_path: Path) -> str:
    passwords = PasswordFile()
    passwords.set("alice", "pw1", iterations=1000)
    path = tmp_path / "passwd"
    passwords.save(path)
    return str(path)


async def test_update_secret_checks_the_new_secret(data_dir: Path, tmp_path: Path) -> None:
    config = {"password_file": _password_file(tmp_path), "allow_anonymous": False}
    async with amqp_gateway(data_dir, **config) as (_, url):
        url = url.replace("guest:guest", "alice:pw1")
        conn = await aio_pika.connect(url)
        await asyncio.wait_for(conn.update_secret("pw1", reason="token refresh"), TIMEOUT)
        ch = await conn.channel()
        await ch.declare_queue("still-open")
        closed = asyncio.get_running_loop().create_future()
        conn.close_callbacks.add(lambda _, exc: closed.done() or closed.set_result(exc))
        with pytest.raises(Exception):
            await asyncio.wait_for(conn.update_secret("wrong"), TIMEOUT)
        reason = await asyncio.wait_for(closed, TIMEOUT)
        assert "403" in str(reason) or "ACCESS_REFUSED" in str(reason)


async def test_amqplain_login_through_py_amqp(data_dir: Path, tmp_path: Path) -> None:
    config = {"password_file": _password_file(tmp_path), "allow_anonymous": False}
    async with amqp_gateway(data_dir, **config) as (gw, url):
        host = f"127.0.0.1:{port_of(url)}"

        def session(password: str) -> int:
            conn = amqp.Connection(host=host, userid="alice", password=password, login_method="AMQPLAIN",
                                   connect_timeout=TIMEOUT)
            conn.connect()
            try:
                ch = conn.channel()
                ch.queue_declare("plain", durable=False, auto_delete=False)
                ch.basic_publish(amqp.Message(b"via amqplain"), routing_key="plain")
                return ch.queue_declare("plain", passive=True).message_count
            finally:
                conn.close()

        await asyncio.to_thread(session, "pw1")
        await _eventually(lambda: gw.store.max_offset_now("q:plain") == 1)
        with pytest.raises(amqp.exceptions.AccessRefused):
            await asyncio.to_thread(session, "wrong")
