"""Embedded lookup nodes in one event loop for tests: ``InProcessNetwork`` can crash a node,
slow it down or cut a link, and every message makes a JSON round trip, so tests catch what
would not travel over the TCP transport."""

from __future__ import annotations

import asyncio
import json

from lookup.transport import Handler, LookupUnavailable, Request


def _wire(payload: Request) -> Request:
    """What the other side gets: a JSON round trip, so tests catch what would not travel."""
    return json.loads(json.dumps(payload))


class InProcessNetwork:
    """Nodes in one event loop. ``crash(n)``: n neither answers nor reaches anyone (its
    entries must expire elsewhere); ``slow(n, s, ops)``: n handles every request (or those of
    the ``ops`` named) ``s`` seconds late; ``cut(a, b)``: the link between a and b fails both
    ways."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._names: set[str] = set()
        self._down: set[str] = set()
        self._delay: dict[str, tuple[float, frozenset[str] | None]] = {}
        self._cut: set[frozenset[str]] = set()

    def transport(self, node_id: str) -> InProcessTransport:
        self._names.add(node_id)
        return InProcessTransport(self, node_id)

    def crash(self, node_id: str) -> None:
        self._down.add(node_id)

    def revive(self, node_id: str) -> None:
        self._down.discard(node_id)

    def slow(self, node_id: str, seconds: float, ops: set[str] | None = None) -> None:
        self._delay[node_id] = (seconds, frozenset(ops) if ops is not None else None)

    def cut(self, a: str, b: str) -> None:
        self._cut.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        self._cut.discard(frozenset((a, b)))

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._names)

    async def deliver(self, source: str, target: str, request: Request) -> Request:
        if source in self._down or target in self._down or frozenset((source, target)) in self._cut:
            raise LookupUnavailable(f"{target} is unreachable from {source}")
        handler = self._handlers.get(target)
        if handler is None:
            raise LookupUnavailable(f"{target} is not listening")
        delay, ops = self._delay.get(target, (0.0, None))
        if delay and (ops is None or request.get("op") in ops):
            await asyncio.sleep(delay)
        try:
            return _wire(await handler(_wire(request)))
        except (ValueError, TypeError, KeyError) as exc:  # as the TCP transport's error reply
            raise LookupUnavailable(f"{target} failed to serve {request.get('op')!r}: {exc}") from exc


class InProcessTransport:
    def __init__(self, network: InProcessNetwork, node_id: str) -> None:
        self.network = network
        self.node_id = node_id
        self._handler: Handler | None = None

    def bind(self, handler: Handler) -> None:
        self._handler = handler

    def peers(self) -> frozenset[str]:
        return self.network.names

    async def start(self) -> None:
        if self._handler is None:
            raise RuntimeError("bind a handler before start")
        self.network._handlers[self.node_id] = self._handler

    async def call(self, node_id: str, request: Request) -> Request:
        return await self.network.deliver(self.node_id, node_id, request)

    async def close(self) -> None:
        self.network._handlers.pop(self.node_id, None)
