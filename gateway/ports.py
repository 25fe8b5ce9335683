"""Ports: what the MQTT gateway needs of the store and of the rest of the cluster, as small typed
Protocols. Each has a local implementation (a standalone or store node: the store is here) and a
cluster one (``--role gateway``: the store node is a link away), chosen once at start-up by
``gateway/server.py``; protocol code never asks which kind of node it runs on.

A step only a gateway node takes is a method whose local implementation does nothing (or the
local thing). Where a gateway node must wait for the store node before it can answer -- a
session loaded when its client connects, what a SUBSCRIBE reads first -- the method is async in
both implementations, and the local one answers at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from protocols.mqtt.packets import Subscribe
from store import GetResult, Message, PutResult, StoredMessage, StoreError
from store import NotifySubscription


class KeyValueTable(Protocol):
    """A durable str -> bytes table of the store (a gateway node's: the store node's, whose
    writes go out at once, in order on the link)."""

    async def load(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...

    def items(self, prefix: str = "") -> Iterator[tuple[str, bytes]]:
        """(a gateway node's: none -- it reads a table key by key)"""
        ...


class QueueStore(Protocol):
    """Store reads and puts as the MQTT gateway makes them: ``store.MessageStore`` locally, the
    store link's ``GatewayStore`` on a gateway node. Synchronous on purpose (a pump reads inside
    one turn of the loop); a gateway node answers from what it knows and fetches the rest."""

    def put_batch_nowait(self, items: Iterable[tuple[Message, Sequence[str]]]) -> asyncio.Future[Sequence[PutResult]]: ...

    def put_each_nowait(self, items: Sequence[tuple[Message, Sequence[str]]], groups: Sequence[Hashable] | None = None,
                        ) -> tuple[asyncio.Future[Sequence[PutResult]], dict[int, StoreError]]: ...

    def get_now(self, queue: str, offset: int, max_messages: int = 32, max_bytes: int = 4 << 20) -> GetResult: ...

    def max_offset_now(self, queue: str) -> int: ...

    def min_offset_now(self, queue: str) -> int: ...

    def get_offset_now(self, consumer: str, queue: str) -> int | None: ...

    def commit_offset_now(self, consumer: str, queue: str, offset: int) -> None: ...

    def save_offset_now(self, consumer: str, queue: str, offset: int) -> None: ...

    def subscribe_notify(self) -> NotifySubscription: ...

    def listen_notify(self, listener: Callable[[dict[str, int]], None]) -> None: ...

    def unlisten_notify(self, listener: Callable[[dict[str, int]], None]) -> None: ...

    def after_commit(self, callback: Callable[[], None]) -> None:
        """For a notify listener: ``callback()`` once the commit it heard of is complete."""
        ...

    def read_at(self, position: int) -> StoredMessage | None:
        """None: retention removed it; ``PositionNotLoadedError``: not at hand (``Reads.read_positions``)."""
        ...

    def table(self, name: str) -> KeyValueTable: ...


class SessionRepository(Protocol):
    """Where MQTT sessions are kept while their clients are away: the local store's table (a
    standalone node keeps every session in memory too), or the store node's (a gateway node
    keeps in memory only the sessions of its own clients)."""

    keeps_offline: bool  # a session whose client is away stays in memory (False: it is stored, then dropped)

    def unavailable(self) -> str | None:
        """Why no session can be taken up now (None: they can)."""
        ...

    def stored(self) -> Iterable[tuple[str, bytes]]:
        """The sessions this node takes up when it starts (a gateway node: none)."""
        ...

    async def claim(self, client_id: str, restore: Callable[[str, bytes | None], None]) -> None:
        """``client_id`` connects here: a gateway node has it disconnected wherever else it is
        (its session saved there), then hands ``restore`` the stored session (None: there is
        none), which replaces what memory holds; a local node's memory is the truth already."""
        ...

    def put(self, client_id: str, raw: bytes) -> None: ...

    def save(self, sessions: Sequence[tuple[str, bytes]]) -> Awaitable[None] | None:
        """Write sessions -- (client id, stored form) -- in one go, ahead of anything written
        after them: None when they are durable on return (a local store), else an awaitable
        that resolves once they are (the store node answered; StoreError when it did not).
        What a client was sent waits for this (gateway/mqtt/session_saves.py)."""
        ...

    def delete(self, client_id: str) -> None: ...

    def client_gone(self, client_id: str) -> None:
        """A client of this node disconnected, its session written (a gateway node: offline in the lookup)."""
        ...


class FilterRegistry(Protocol):
    """The MQTT topic filters subscribed to, and from them the target queues of a publish."""

    def hold(self, topic_filter: str, holder: str, durable: bool) -> None:
        """One more subscription of ``holder`` (a client id) to ``topic_filter``; ``durable``:
        it outlives this node's link (a persistent session)."""
        ...

    def release(self, topic_filter: str, holder: str) -> None: ...

    def queues_for(self, topic: str) -> list[str]: ...

    def reads(self, queue: str) -> bool:
        """Whether a subscription or a hold reads the store queue (asked by the reclaim of a
        store this node has)."""
        ...


class RetainedStore(Protocol):
    """Retained messages by topic (on a gateway node, the store node's: matched beforehand by
    ``Reads.prepare_subscribe``)."""

    def load(self) -> None: ...

    def __len__(self) -> int: ...

    def set(self, topic: str, position: int | None) -> Awaitable[None] | None:
        """Record (None: clear) the retained message of ``topic``; an awaitable when the change
        is held as the store promises only later (a replicated store: once its replicas
        confirm it), which the publish's acknowledgement waits for."""
        ...

    def matching(self, topic_filter: str) -> list[StoredMessage]: ...


class Reads(Protocol):
    """What a node reads, and what must be fetched before a read can be answered at once."""

    def reading(self, queue: str) -> None:
        """The first local reader of ``queue`` (a gateway node: its notify events come here)."""
        ...

    def not_reading(self, queue: str) -> None: ...

    def prepare_subscribe(self, packet: Subscribe) -> Coroutine[Any, Any, None] | None:
        """A coroutine fetching what handling ``packet`` reads (its queues' offsets, its shared
        groups' offsets, retained messages), or None when all is here (always, locally).
        The packet's queues count as read until ``subscribed``."""
        ...

    def subscribed(self, packet: Subscribe) -> None:
        """The prepared SUBSCRIBE was handled (or its connection went)."""
        ...

    async def prepare_groups(self, groups: Sequence[tuple[str, str]]) -> None:
        """Fetch the committed offsets of shared groups -- (consumer, queue) -- a reconnecting
        session rejoins, before their start is read (locally: here already)."""
        ...

    async def read_positions(self, positions: Iterable[int]) -> dict[int, StoredMessage | None]:
        """Messages by commitlog position, None for one retention removed -- never for one
        merely not at hand (StoreError when that cannot be known now)."""
        ...


@dataclass(slots=True, frozen=True)
class MQTTPorts:
    """The MQTT gateway's ports, as one node kind implements them."""

    store: QueueStore
    sessions: SessionRepository
    filters: FilterRegistry
    retained: RetainedStore
    reads: Reads
    # why this kind of node refuses shared subscriptions (SUBACK 0x9E), None where it serves
    # them: a ``$share`` group must have one owner, and a gateway node's group would be one copy
    # among several over the same committed offset (every message once per node)
    shared_refusal: str | None = None
