"""Refused WebSocket connections (a health check's bare connect and close, malformed opening
handshakes): a 400 for malformed headers, a log line per cause per interval (not a traceback
each), and no garbage left for the cyclic collector."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gateway.config import Config
from gateway.server import Gateway

ROOT = Path(__file__).resolve().parent.parent
GOOD_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="


def handshake(extra: bytes = b"", key: bytes = GOOD_KEY) -> bytes:
    return (b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n" + extra + b"\r\n")


def exchange(port: int, request: bytes | None) -> bytes:
    """One connection: send ``request`` (None: connect and close at once), read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        if request is None:
            return b""
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        return answer


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def start_ws_gateway(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    """``tidemq serve`` with only the WebSocket listener, its log on a pipe; and its port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMQ_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--data-dir", str(tmp_path / "data"), "--mqtt-bind", "",
         "--amqp-bind", "", "--remoting-bind", "", "--ws-bind", "127.0.0.1:0"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any("gateway ready" in line for line in lines):
        lines.append(proc.stderr.readline())
    return proc, int(re.search(r"protocol=ws address=127\.0\.0\.1:(\d+)", "".join(lines)).group(1))


def send_and_close(port: int, request: bytes) -> None:
    """A client that sends ``request`` and closes without reading the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)


def test_request_then_close_before_the_answer_is_no_error(tmp_path: Path) -> None:
    proc, port = start_ws_gateway(tmp_path)
    try:
        for _ in range(20):  # bare GETs (a health check), and a whole handshake, each closed at once
            send_and_close(port, b"GET /mqtt HTTP/1.1\r\n\r\n")
            send_and_close(port, b"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            send_and_close(port, handshake(b"Sec-WebSocket-Protocol: mqtt\r\n"))
        assert status(exchange(port, handshake())) == 400  # (and the listener still answers)
    finally:
        proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest
    assert "Traceback" not in rest and "level=error" not in rest, rest


def test_malformed_headers_get_400_and_refusals_are_logged_once_per_cause(tmp_path: Path) -> None:
    proc, port = start_ws_gateway(tmp_path)
    try:
        for _ in range(100):  # health checks: connect, close
            exchange(port, None)
        # header values that are not ASCII: the library itself answers 500, or nothing
        assert status(exchange(port, handshake(key=b"\xff\xfe"))) == 400
        assert status(exchange(port, handshake(b"Sec-WebSocket-Protocol: mq\xfftt\r\n"))) == 400
        for _ in range(50):
            assert status(exchange(port, handshake())) == 400  # no subprotocol
        assert status(exchange(port, handshake(b"Sec-WebSocket-Protocol: mqtt\r\n", key=b"abc"))) == 400
    finally:
        proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest
    logged = [line for line in rest.splitlines() if "websocket" in line]
    # one line per cause: not ASCII, no subprotocol, a bad key; health checks say nothing at INFO
    assert len(logged) == 3, logged
    assert all("level=info" in line and "count=1" in line for line in logged), logged
    assert "Traceback" not in rest and "level=error" not in rest, rest


async def test_refused_connections_leave_no_cyclic_garbage(data_dir: Path) -> None:
    gw = Gateway(Config(data_dir=data_dir, mqtt_bind="", amqp_bind="", remoting_bind="", ws_bind="127.0.0.1:0"))
    await gw.start()
    try:
        port = gw.listeners[0].address[1]
        requests = [None, handshake(), handshake(key=b"\xff"), b"NOT HTTP\r\n\r\n"]
        for request in requests:  # warm up: first-use allocations are not garbage
            await asyncio.to_thread(exchange, port, request)
        await asyncio.sleep(0.2)
        gc.collect()
        gc.disable()
        logging.disable(logging.CRITICAL)  # (pytest keeps log records, and with them what they refer to)
        try:
            count = 0
            for _ in range(25):
                for request in requests:
                    await asyncio.to_thread(exchange, port, request)
                    count += 1
            await asyncio.sleep(0.5)  # the server side finishes its connections
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            garbage = list(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
            logging.disable(logging.NOTSET)
        kinds = {f"{type(o).__module__}.{type(o).__name__}" for o in garbage}
        ours = {k for k in kinds if k.startswith(("websockets.", "gateway.")) or k in (
            "builtins.frame", "builtins.traceback", "builtins.coroutine", "builtins.generator")}
        assert not ours, ours
        # left: CPython 3.11's socket transport holds a bound method of itself (gh-106503,
        # fixed in 3.12), 7 small objects a connection
        assert len(garbage) <= 8 * count, sorted(kinds)
    finally:
        await gw.stop()
