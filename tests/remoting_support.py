"""Test helpers for the remoting gateway: a real gateway with its remoting listener on an
ephemeral port, and the two third-party clients the tests drive -- ali-ons (npm, run by node
in its own process, one JSON line per event) and the C++ client in PyPI's ``rocketmq`` -- and
``RawRemoting``, requests at the frame level for what no installable client sends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gateway.config import Config
from gateway.server import Gateway
from protocols.remoting.frames import FrameReader, RemotingCommand, encode

JS_DIR = Path(__file__).resolve().parent / "remoting_js"
ONS_CLIENT = JS_DIR / "ons_client.js"
# short delay levels so retries and delayed messages are quick in tests
TEST_DELAY_LEVELS = " ".join(["200ms"] * 18)
RAW_TIMEOUT = 5.0


@contextlib.asynccontextmanager
async def remoting_gateway(data_dir: Path, **config: Any) -> AsyncIterator[tuple[Gateway, str]]:
    config.setdefault("mqtt_bind", "")
    config.setdefault("amqp_bind", "")
    config.setdefault("remoting_delay_levels", TEST_DELAY_LEVELS)
    config.setdefault("remoting_bind", "127.0.0.1:0")
    gw = Gateway(Config(data_dir=data_dir, **config))
    await gw.start()
    port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "remoting")
    try:
        yield gw, f"127.0.0.1:{port}"
    finally:
        await gw.stop()


class OnsProcess:
    """One ali-ons command in a node process; its JSON lines are read as they come."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []
        self.error_output = ""

    @classmethod
    async def start(cls, spec: dict[str, Any]) -> OnsProcess:
        if shutil.which("node") is None or not (JS_DIR / "node_modules" / "ali-ons").is_dir():
            raise AssertionError("ali-ons is not installed: scripts/test.sh runs npm ci --prefix tests/remoting_js")
        proc = await asyncio.create_subprocess_exec(
            "node", str(ONS_CLIENT), json.dumps(spec), cwd=str(JS_DIR),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "HOME": str(JS_DIR)})
        return cls(proc)

    async def next_event(self, timeout: float = 30.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise AssertionError(f"ali-ons exited without the expected output: {await self.stderr()}")
        event = json.loads(line)
        self.events.append(event)
        return event

    async def until(self, kind: str, timeout: float = 30.0) -> dict[str, Any]:
        while True:
            event = await self.next_event(timeout)
            if event["event"] == kind:
                return event

    async def finish(self, timeout: float = 60.0) -> list[dict[str, Any]]:
        assert self.proc.stdout is not None
        try:
            rest, err = await asyncio.wait_for(self.proc.communicate(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError("ali-ons did not finish in time") from None
        self.events.extend(json.loads(line) for line in rest.decode().splitlines() if line.strip())
        self.error_output = err.decode()
        if self.proc.returncode != 0:
            raise AssertionError(f"ali-ons failed ({self.proc.returncode}): {err.decode()[-2000:]}")
        return self.events

    async def stderr(self) -> str:
        assert self.proc.stderr is not None
        try:
            return (await asyncio.wait_for(self.proc.stderr.read(), 5)).decode()[-2000:]
        except TimeoutError:
            return ""

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


async def ons(spec: dict[str, Any], timeout: float = 60.0) -> list[dict[str, Any]]:
    """Run one ali-ons command to its end; its events."""
    process = await OnsProcess.start(spec)
    try:
        return await process.finish(timeout)
    finally:
        process.kill()


class RawRemoting:
    """A remoting client at the frame level: requests as the tests write them, replies as sent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = FrameReader()
        self.pending: list[RemotingCommand] = []
        self.server_requests: list[RemotingCommand] = []
        self._opaque = 0

    @classmethod
    async def open(cls, addr: str) -> RawRemoting:
        host, port = addr.split(":")
        return cls(*await asyncio.open_connection(host, int(port)))

    def send(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"", *, flag: int = 0,
             serialize_type: int = 0) -> int:
        self._opaque += 1
        self.writer.write(encode(RemotingCommand(code, self._opaque, flag, ext or {}, body,
                                                 serialize_type=serialize_type)))
        return self._opaque

    async def recv(self, timeout: float = RAW_TIMEOUT) -> RemotingCommand:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionError("closed")
            self.pending.extend(self.frames.feed(data))
        return self.pending.pop(0)

    async def call(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"", *,
                   timeout_s: float = RAW_TIMEOUT, **kw) -> RemotingCommand:
        opaque = self.send(code, ext, body, **kw)
        response = await self.recv(timeout_s)
        while not response.is_response:  # the broker's own requests (NOTIFY_CONSUMER_IDS_CHANGED)
            self.server_requests.append(response)
            response = await self.recv(timeout_s)
        assert response.opaque == opaque
        return response

    async def closed(self) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(65536), RAW_TIMEOUT) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.writer.close()


def send_header(topic: str, queue_id: int = 0, **extra: str) -> dict[str, str]:
    return {"producerGroup": "raw", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": str(queue_id), "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)),
            "flag": "0", "properties": "", "reconsumeTimes": "0", **extra}


def pull_header(topic: str, offset: int, *, suspend_ms: int = 0) -> dict[str, str]:
    return {"consumerGroup": "raw-g", "topic": topic, "queueId": "0", "queueOffset": str(offset),
            "maxMsgNums": "32", "sysFlag": "2" if suspend_ms else "0", "commitOffset": "0",
            "suspendTimeoutMillis": str(suspend_ms), "subscription": "*", "subVersion": "0"}
