"""The lookup's mapping, sans-IO: key -> mmh3 hash -> slot -> node over a consistent-hash ring
with virtual nodes, and the membership (heart-beating nodes, an epoch, a settle window) it is
built from. Nothing here touches a socket or a clock: callers pass ``now``.

A key's 32-bit mmh3 hash picks a slot (its top ``slot_bits`` bits); a slot belongs to the node of
the first virtual-node point at or after the slot's start on the ring. Adding a node only moves
slots to it, removing one only moves its own slots, so about 1/N of the keys move either way.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass

import mmh3

DEFAULT_VNODES = 160  # points per node: shares within ~+-10 % of 1/N (ketama uses the same)
DEFAULT_SLOT_BITS = 14  # 16,384 slots, as Redis Cluster
_HASH_BITS = 32


def key_hash(key: str) -> int:
    """The unsigned 32-bit mmh3 of ``key``: the one hash of the lookup, for slots and points."""
    return mmh3.hash(key, 0, False)


class Ring:
    """An immutable consistent-hash ring over node ids, flattened into a slot -> node table."""

    __slots__ = ("_table", "nodes", "slot_bits", "vnodes")

    def __init__(self, nodes: Iterable[str], vnodes: int = DEFAULT_VNODES,
                 slot_bits: int = DEFAULT_SLOT_BITS) -> None:
        if vnodes < 1:
            raise ValueError(f"vnodes must be at least 1, not {vnodes}")
        if not 0 <= slot_bits <= 20:
            raise ValueError(f"slot_bits must be within 0..20, not {slot_bits}")
        self.nodes: frozenset[str] = frozenset(nodes)
        self.vnodes = vnodes
        self.slot_bits = slot_bits
        # ties between equal points go to the smaller node id, the same on every node
        points = sorted((key_hash(f"{node}#{i}"), node) for node in self.nodes for i in range(vnodes))
        hashes = [h for h, _ in points]
        shift = _HASH_BITS - slot_bits
        table: list[str | None] = []
        at = 0
        for slot in range(1 << slot_bits):
            if not points:
                table.append(None)
                continue
            at = bisect_left(hashes, slot << shift, at)
            table.append(points[at % len(points)][1])  # past the last point: wrap to the first
        self._table: tuple[str | None, ...] = tuple(table)

    @property
    def slots(self) -> int:
        return len(self._table)

    def slot(self, key: str) -> int:
        return key_hash(key) >> (_HASH_BITS - self.slot_bits)

    def owner(self, key: str) -> str | None:
        """The node owning ``key``; None only for a ring without nodes."""
        return self._table[key_hash(key) >> (_HASH_BITS - self.slot_bits)]

    def owner_of_slot(self, slot: int) -> str | None:
        return self._table[slot]

    def moved_slots(self, other: Ring) -> list[int]:
        """Slots whose owner differs between this ring and ``other`` (same slot count)."""
        if other.slot_bits != self.slot_bits:
            raise ValueError("rings with different slot counts cannot be compared")
        return [s for s, (a, b) in enumerate(zip(self._table, other._table, strict=True)) if a != b]

    def slot_counts(self) -> dict[str, int]:
        """Slots per node: the share of keys each node owns, times ``slots``."""
        counts = dict.fromkeys(self.nodes, 0)
        for node in self._table:
            if node is not None:
                counts[node] += 1
        return counts


def view_digest(incarnations: dict[str, str], vnodes: int, slot_bits: int) -> str:
    """A name for one membership view: equal on two nodes exactly when they map every key to
    the same node (same members, same ring parameters) and no member restarted in between."""
    text = f"v{vnodes}/s{slot_bits}|" + ",".join(f"{n}@{incarnations[n]}" for n in sorted(incarnations))
    return format(mmh3.hash128(text, 0, False), "032x")


@dataclass(slots=True)
class _Member:
    incarnation: str
    last_seen: float


class Membership:
    """The nodes this node believes alive, as heartbeats report them.

    A node joins on its first heartbeat and leaves when it has not heart-beaten for
    ``node_ttl`` (or says it leaves); a new incarnation of a node (it restarted) counts as a
    change too. Every change increments ``epoch`` and rebuilds ``ring``; for ``settle`` seconds
    after one the mapping is in doubt, long enough for every node to see the same change.
    """

    def __init__(self, node_id: str, incarnation: str, *, now: float, node_ttl: float, settle: float,
                 vnodes: int = DEFAULT_VNODES, slot_bits: int = DEFAULT_SLOT_BITS) -> None:
        self.node_id = node_id
        self.node_ttl = node_ttl
        self.settle = settle
        self.vnodes = vnodes
        self.slot_bits = slot_bits
        self._members: dict[str, _Member] = {node_id: _Member(incarnation, now)}
        self.epoch = 0
        self.changed_at = now
        self.ring = Ring((), vnodes, slot_bits)
        self.view = ""
        self._changed(now)

    @property
    def members(self) -> frozenset[str]:
        return self.ring.nodes

    def incarnation_of(self, node_id: str) -> str | None:
        member = self._members.get(node_id)
        return member.incarnation if member else None

    def heartbeat(self, node_id: str, incarnation: str, now: float) -> bool:
        """Record a heartbeat of ``node_id``; True when it changed the membership."""
        member = self._members.get(node_id)
        if member is not None and member.incarnation == incarnation:
            member.last_seen = max(member.last_seen, now)
            return False
        if node_id == self.node_id:
            return False  # only this node names its own incarnation
        self._members[node_id] = _Member(incarnation, now)
        self._changed(now)
        return True

    def leave(self, node_id: str, now: float) -> bool:
        if node_id == self.node_id or self._members.pop(node_id, None) is None:
            return False
        self._changed(now)
        return True

    def expire(self, now: float) -> list[str]:
        """Remove the nodes silent for ``node_ttl``; returns them."""
        gone = [n for n, m in self._members.items() if n != self.node_id and now - m.last_seen >= self.node_ttl]
        for node in gone:
            del self._members[node]
        if gone:
            self._changed(now)
        return gone

    def settling(self, now: float) -> bool:
        return now - self.changed_at < self.settle

    def _changed(self, now: float) -> None:
        self.epoch += 1
        self.changed_at = now
        self.ring = Ring(self._members, self.vnodes, self.slot_bits)
        self.view = view_digest({n: m.incarnation for n, m in self._members.items()}, self.vnodes, self.slot_bits)
