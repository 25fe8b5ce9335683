"""Event-rule tests' helpers: a real aiohttp webhook server that records what it is sent and
fails on command (answers a status, or is down: its port closed), and the admin API of a
gateway over HTTP (urllib, as ``tidemq ctl`` calls it)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from aiohttp import web


@dataclass(slots=True)
class Hit:
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Webhook:
    """Answers ``status`` to every POST (2xx ones are recorded in ``received``); ``down()``
    closes its port and ``up()`` listens on the same port again."""

    def __init__(self) -> None:
        self.received: list[Hit] = []
        self.refused = 0  # requests answered with a status not 2xx
        self.status = 200
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/events"

    async def up(self) -> None:
        app = web.Application()
        app.router.add_post("/events", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def down(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if not 200 <= self.status < 300:
            self.refused += 1
            return web.Response(status=self.status)
        self.received.append(Hit(dict(request.headers), body))
        return web.Response(status=self.status)

    async def wait_for(self, count: int, timeout_s: float = 20.0) -> list[Hit]:
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"the webhook got {len(self.received)} of {count} events: "
                                     f"{[h.body for h in self.received]}")
            await asyncio.sleep(0.02)
        return self.received


def admin(base: str, method: str, path: str, body: Any = None, token: str = "") -> tuple[int, Any]:
    """(status, decoded JSON answer) of an admin API call (blocking: run it in a thread)."""
    request = urllib.request.Request(base + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def call(base: str, method: str, path: str, body: Any = None, token: str = "") -> tuple[int, Any]:
    return await asyncio.to_thread(admin, base, method, path, body, token)


async def until(predicate, timeout_s: float = 20.0, what: str = "a condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
