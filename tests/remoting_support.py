"""Test helpers for the remoting gateway: a real gateway with its remoting listener on an
ephemeral port, and the two third-party clients the tests drive -- ali-ons (npm, run by node
in its own process, one JSON line per event) and the C++ client in PyPI's ``rocketmq``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gateway.config import Config
from gateway.server import Gateway

JS_DIR = Path(__file__).resolve().parent / "remoting_js"
ONS_CLIENT = JS_DIR / "ons_client.js"
# short delay levels so retries and delayed messages are quick in tests
TEST_DELAY_LEVELS = " ".join(["200ms"] * 18)


@contextlib.asynccontextmanager
async def remoting_gateway(data_dir: Path, **config: Any) -> AsyncIterator[tuple[Gateway, str]]:
    config.setdefault("mqtt_bind", "")
    config.setdefault("amqp_bind", "")
    config.setdefault("remoting_delay_levels", TEST_DELAY_LEVELS)
    gw = Gateway(Config(data_dir=data_dir, remoting_bind="127.0.0.1:0", **config))
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
