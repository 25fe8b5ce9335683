"""Retained messages: topic -> commitlog position of the message retained for it, kept in a
store KV table so that they survive restarts (the message itself is in the commitlog).

One index per store: the embedded MQTT broker's, or, on a store node, the one its gateway
nodes set and query over the store link.
"""

from __future__ import annotations

import asyncio
import struct

from protocols.mqtt.topics import matches
from store import MessageStore, StoredMessage, StoreError

RETAINED_TABLE = "mqtt.retained"
_POSITION = struct.Struct(">Q")


class RetainedIndex:
    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self._table = store.table(RETAINED_TABLE)
        self.positions: dict[str, int] = {}

    def load(self) -> None:
        for topic, raw in self._table.items():
            self.positions[topic] = _POSITION.unpack(raw)[0]

    def __len__(self) -> int:
        return len(self.positions)

    def __contains__(self, topic: str) -> bool:
        return topic in self.positions

    def set(self, topic: str, position: int | None) -> asyncio.Future[None] | None:
        """Retain the message at ``position`` for ``topic``; None clears it (empty payload).
        Written first: StoreError when that failed, and nothing changed. A future when the
        store holds it as promised only later (``MessageStore.meta_settling``)."""
        if position is None:
            if topic not in self.positions:
                return None
            self._table.delete(topic)
            del self.positions[topic]
        else:
            self._table.put(topic, _POSITION.pack(position))
            self.positions[topic] = position
        return self.store.meta_settling()

    def forget(self, topic: str) -> None:
        """The retained message of ``topic`` is gone (removed by retention, expired): no longer
        retained; its stored entry is deleted if it can be (else the next start finds it gone)."""
        if self.positions.pop(topic, None) is not None:
            try:
                self._table.delete(topic)
            except StoreError:
                pass

    def matching(self, topic_filter: str) -> list[StoredMessage]:
        """The retained messages of the topics ``topic_filter`` matches (a scan of the topics)."""
        found = []
        for topic in [t for t in self.positions if matches(topic_filter, t)]:
            message = self.store.read_at(self.positions[topic])
            if message is None:  # removed by retention: the retained message is gone too
                self.forget(topic)
                continue
            found.append(message)
        return found
