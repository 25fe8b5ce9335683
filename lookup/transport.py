"""How embedded lookup nodes reach each other: the ``Transport`` interface (an async
``call(node_id, request) -> response`` of JSON-able dicts, and a handler for what arrives). The
TCP transport over remoting frames is ``lookup.tcp.TcpTransport``; the tests' in-process network
(crashes, slow nodes, cut links) is ``tests/lookup_network.py``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

Request = dict[str, Any]
Handler = Callable[[Request], Awaitable[Request]]


class LookupUnavailable(ConnectionError):
    """The peer cannot be reached: unknown, down, or the connection was lost."""


class Transport(Protocol):
    """What ``EmbeddedLookup`` needs from the network. ``call`` raises ``OSError`` (such as
    ``LookupUnavailable``) when the peer cannot be reached; the caller bounds it with its
    deadline. Requests from one node to another are handled in the order they were sent."""

    def bind(self, handler: Handler) -> None: ...

    def peers(self) -> frozenset[str]:
        """The node ids this transport can address (the cluster's address book)."""
        ...

    async def start(self) -> None: ...

    async def call(self, node_id: str, request: Request) -> Request: ...

    async def close(self) -> None: ...
