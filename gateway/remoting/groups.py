"""Consumer groups as the broker sees them through heartbeats (RocketMQ's ConsumerManager):
which clients are in a group, over which connection, subscribed to what. Clients rebalance
queues among themselves from GET_CONSUMER_LIST_BY_GROUP; when a group's members change the
broker tells every member (NOTIFY_CONSUMER_IDS_CHANGED) so they rebalance at once.

A member that stops sending heartbeats is dropped after ``expiry_s`` (RocketMQ: 120 s), as
is every member of a connection that closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Subscription:
    topic: str
    expression: str  # TAG: "*" or "TagA || TagB"; SQL92: the expression
    expression_type: str = "TAG"
    sub_version: int = 0


@dataclass(slots=True)
class Member:
    client_id: str
    connection: Any  # the RemotingConnection it sent its heartbeat over
    last_heartbeat: float
    principal: Any = None  # who signed its heartbeat (access.py: what its pops may read)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"


class ConsumerGroups:
    def __init__(self, *, expiry_s: float = 120.0) -> None:
        self.expiry_s = expiry_s
        self.groups: dict[str, dict[str, Member]] = {}
        self.on_members_changed: Callable[[str, list[Member]], None] | None = None

    def heartbeat(self, group: str, client_id: str, connection: Any, subscriptions: list[Subscription],
                  message_model: str, consume_from_where: str, now: float | None = None,
                  principal: Any = None) -> None:
        members = self.groups.setdefault(group, {})
        member = members.get(client_id)
        changed = member is None or member.connection is not connection
        if member is None:
            member = members[client_id] = Member(client_id, connection, 0.0)
        member.connection = connection
        member.principal = principal
        member.last_heartbeat = time.monotonic() if now is None else now
        member.subscriptions = {s.topic: s for s in subscriptions}
        member.message_model = message_model
        member.consume_from_where = consume_from_where
        if changed:
            self._changed(group)

    def unregister(self, group: str, client_id: str) -> None:
        members = self.groups.get(group)
        if members and members.pop(client_id, None) is not None:
            if not members:
                del self.groups[group]
            self._changed(group)

    def connection_closed(self, connection: Any) -> None:
        self._drop(lambda member: member.connection is connection)

    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._drop(lambda member: now - member.last_heartbeat > self.expiry_s)

    def _drop(self, gone: Callable[[Member], bool]) -> None:
        for group, members in list(self.groups.items()):
            leaving = [cid for cid, member in members.items() if gone(member)]
            for client_id in leaving:
                del members[client_id]
            if not members:
                del self.groups[group]
            if leaving:
                self._changed(group)

    def client_ids(self, group: str) -> list[str]:
        return sorted(self.groups.get(group, {}))

    def members(self, group: str) -> list[Member]:
        return list(self.groups.get(group, {}).values())

    def subscription(self, group: str, topic: str) -> Subscription | None:
        for member in self.groups.get(group, {}).values():
            sub = member.subscriptions.get(topic)
            if sub is not None:
                return sub
        return None

    def _changed(self, group: str) -> None:
        if self.on_members_changed is not None:
            self.on_members_changed(group, self.members(group))
