"""The MQTT gateway's ports (gateway/ports.py) where the store is in this process: a standalone
node. Sessions are the store's KV table and all of them are in memory; nothing needs fetching
before a read, so the steps a gateway node takes to reach its store node do nothing here."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from protocols.mqtt.packets import Subscribe
from store import MessageStore, StoredMessage
from store import KvTable

from ..ports import MQTTPorts
from .queues import WildcardQueues
from .retained import RetainedIndex
from .session import SESSIONS_TABLE


class StoredSessions:
    """``SessionRepository`` over the local store's ``mqtt.sessions`` table."""

    keeps_offline = True

    def __init__(self, table: KvTable) -> None:
        self.table = table

    def unavailable(self) -> str | None:
        return None

    def stored(self) -> Iterable[tuple[str, bytes]]:
        return list(self.table.items())

    async def claim(self, client_id: str, restore: Callable[[str, bytes | None], None]) -> None:
        return None  # (memory holds every session of this node: the truth already)

    def put(self, client_id: str, raw: bytes) -> None:
        self.table.put(client_id, raw)

    def save(self, sessions: Sequence[tuple[str, bytes]]) -> None:
        self.table.put_many(sessions)  # one write (one fsync in sync flush mode) for a turn's sessions

    def delete(self, client_id: str) -> None:
        if self.table.get(client_id) is not None:  # (a clean session was never written: no write)
            self.table.delete(client_id)

    def client_gone(self, client_id: str) -> None:
        pass


class LocalReads:
    """``Reads`` of a store in this process: everything is at hand."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store

    def reading(self, queue: str) -> None:
        pass

    def not_reading(self, queue: str) -> None:
        pass

    def prepare_subscribe(self, packet: Subscribe) -> Coroutine[Any, Any, None] | None:
        return None

    def subscribed(self, packet: Subscribe) -> None:
        pass

    async def prepare_groups(self, groups: Sequence[tuple[str, str]]) -> None:
        return None

    async def read_positions(self, positions: Iterable[int]) -> dict[int, StoredMessage | None]:
        read_at = self.store.read_at
        return {position: read_at(position) for position in positions}


def local_ports(store: MessageStore, wildcards: WildcardQueues) -> MQTTPorts:
    """``wildcards``: the node's wildcard queues, which the other protocols' gateways join (server.py)."""
    return MQTTPorts(store, StoredSessions(store.table(SESSIONS_TABLE)), wildcards, RetainedIndex(store),
                     LocalReads(store))
