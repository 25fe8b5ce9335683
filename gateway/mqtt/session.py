"""MQTT session state: subscriptions, per-queue read cursors, inflight deliveries and QoS 2
state; persisted as one JSON document per client in the store's ``mqtt.sessions`` table.

A subscription reads one queue (see queues.py). For each queue the session keeps a cursor
(the next offset to pull) and the offsets sent but not yet acknowledged; the committed offset
-- where a restart resumes -- is the oldest unacknowledged one, or the cursor.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from protocols.mqtt.packets import Subscription, Will

from ..core.cursor import Cursor
from .push import Inflight, allocate_packet_id  # (a session record compiled with the pusher: push.py says why)

__all__ = ["NEVER_EXPIRES", "SESSIONS_TABLE", "Inflight", "Session", "SubscriptionState"]

NEVER_EXPIRES = 0xFFFF_FFFF
# the inbound QoS 2 packet ids of a session that has none: one empty set shared by all (an
# empty set costs 216 bytes, and most clients never publish at QoS 2); the first is given its own
NO_IDS: frozenset[int] = frozenset()


class _NoEntries(dict):
    """A session's table while it has no entries: one read-only empty dict shared by every
    session (an empty dict is 64 bytes, and an idle client's session has four). Reading,
    popping and clearing work as on any empty dict; adding raises: the session's ``add_...``
    methods give it a table of its own first."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a session's shared empty table: add through the Session's methods")

    __setitem__ = setdefault = update = __ior__ = _refuse  # type: ignore[assignment]


NO_ENTRIES: dict = _NoEntries()
SESSIONS_TABLE = "mqtt.sessions"  # client id -> Session.to_json() (a store node's: its gateway nodes')


@dataclass(slots=True)
class SubscriptionState:
    options: Subscription
    queue: str
    share_group: str | None = None
    identifier: int | None = None

    @property
    def topic_filter(self) -> str:
        return self.options.topic_filter


@dataclass(slots=True)
class Session:
    client_id: str
    version: int
    expiry_interval: int = 0  # seconds after disconnect; NEVER_EXPIRES for 3.1.1 persistent
    # (the four tables start as NO_ENTRIES, shared; the add_... methods give a session its own)
    subscriptions: dict[str, SubscriptionState] = field(default_factory=lambda: NO_ENTRIES)  # by filter text
    cursors: dict[str, Cursor] = field(default_factory=lambda: NO_ENTRIES)  # by queue
    inflight: dict[int, Inflight] = field(default_factory=lambda: NO_ENTRIES)  # by packet id, in the order sent
    # inbound QoS 2 ids before PUBREL (NO_IDS until the first: ``awaiting``)
    awaiting_release: set[int] | frozenset[int] = NO_IDS
    # by shared subscription ("$share/g/f"): offsets of QoS 2 exchanges completed here that its
    # group's written offset has not passed yet (shared.py: not handed out again after a restart)
    shared_done: dict[str, list[int]] = field(default_factory=lambda: NO_ENTRIES)
    disconnected_at: float | None = None
    will: Will | None = None
    next_packet_id: int = 1

    @property
    def persistent(self) -> bool:
        return self.expiry_interval > 0

    def expired(self, now: float | None = None) -> bool:
        if self.disconnected_at is None or self.expiry_interval == NEVER_EXPIRES:
            return False
        return (now if now is not None else time.time()) >= self.disconnected_at + self.expiry_interval

    # (each gives the session a table of its own on its first entry)
    def add_subscription(self, key: str, state: SubscriptionState) -> None:
        if self.subscriptions is NO_ENTRIES:
            self.subscriptions = {}
        self.subscriptions[key] = state

    def add_cursor(self, cursor: Cursor) -> None:
        if self.cursors is NO_ENTRIES:
            self.cursors = {}
        self.cursors[cursor.queue] = cursor

    def add_inflight(self, inflight: Inflight) -> None:
        """(outbound.py's delivery loop does the same inline: it runs per message)"""
        if self.inflight is NO_ENTRIES:
            self.inflight = {}
        self.inflight[inflight.packet_id] = inflight

    def set_shared_done(self, key: str, offsets: list[int]) -> None:
        if self.shared_done is NO_ENTRIES:
            self.shared_done = {}
        self.shared_done[key] = offsets

    def awaiting(self) -> set[int]:
        """``awaiting_release``, a set of this session's own (to add to)."""
        if self.awaiting_release is NO_IDS:
            self.awaiting_release = set()
        return self.awaiting_release  # type: ignore[return-value]

    def allocate_packet_id(self) -> int | None:
        """A free packet id, or None when all 65,535 are in use."""
        return allocate_packet_id(self)

    def queues_read(self) -> set[str]:
        return {s.queue for s in self.subscriptions.values() if s.share_group is None}

    def shares_held(self) -> set[str]:
        """The shared subscriptions of which it holds deliveries, or QoS 2 ones received."""
        return {i.share for i in self.inflight.values() if i.share is not None} | self.shared_done.keys()

    # -- persistence ---------------------------------------------------------------------------
    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "v": self.version,
            "exp": self.expiry_interval,
            "at": self.disconnected_at,
            "subs": [
                [s.options.topic_filter, s.options.qos, s.options.no_local, s.options.retain_as_published,
                 s.options.retain_handling, s.share_group, s.identifier, s.queue]
                for s in self.subscriptions.values()
            ],
            "off": {q: c.committed for q, c in self.cursors.items()},
            # where each cursor is, with what it handed out and nobody settled yet: what lies
            # between the committed offset and ``next`` and is not inflight was settled (or
            # skipped), and is not delivered again after a restart -- a completed QoS 2 message
            # behind an unacknowledged one included
            "next": {q: c.next_offset for q, c in self.cursors.items() if c.next_offset != c.committed},
            # the QoS 1 and 2 PUBLISHes sent and not completely acknowledged, in the order sent:
            # resent with their packet ids after a restart (MQTT 3.1.1 section 4.4); a shared
            # subscription's with its key (its group does not hand them out again: shared.py)
            "out": [[i.packet_id, i.queue, i.offset, i.position, i.qos, i.released]
                    + ([] if i.share is None else [i.share]) for i in self.inflight.values()],
            "q2in": sorted(self.awaiting_release),
            "pid": self.next_packet_id,
        }
        if self.shared_done:
            doc["sdone"] = self.shared_done
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, client_id: str, raw: bytes) -> Session:
        doc = json.loads(raw)
        session = cls(client_id, doc["v"], doc["exp"], disconnected_at=doc.get("at"))
        for f, qos, nl, rap, rh, group, ident, queue in doc["subs"]:
            key = f if group is None else f"$share/{group}/{f}"
            session.add_subscription(key, SubscriptionState(Subscription(f, qos, nl, rap, rh), queue, group, ident))
        committed = doc["off"]
        nexts = doc.get("next", {})
        for queue, offset in committed.items():
            session.add_cursor(Cursor(queue, nexts.get(queue, offset)))
        out = doc["out"] if "out" in doc else [[*q2[:4], 2, q2[4]] for q2 in doc.get("q2out", [])]  # (before "out")
        for pid, queue, offset, position, qos, released, *share in out:
            session.add_inflight(Inflight(pid, queue, offset, qos, position, released, share[0] if share else None))
        for entry in sorted(session.inflight.values(), key=lambda i: i.offset):  # (a cursor's unacked: oldest first)
            cursor = session.cursors.get(entry.queue) if entry.share is None else None
            if cursor is not None and entry.offset >= committed[entry.queue]:
                # resent from the inflight table (PUBLISH with DUP, or PUBREL), not pulled again;
                # the pull goes on at ``next`` (a session stored before "next": at the committed
                # offset, and skips these)
                cursor.unacked[entry.offset] = entry.packet_id
        session.awaiting_release = set(doc.get("q2in", ())) or NO_IDS
        session.next_packet_id = doc.get("pid", 1)
        for key, offsets in doc.get("sdone", {}).items():
            session.set_shared_done(key, offsets)
        return session
