"""The interface of the lookup, which both backends (``EmbeddedLookup``, ``RedisLookup``)
implement, with its options, answers and counters.

The lookup holds online state only: client id -> node (takeover, ``tidemq ctl clients``) and,
in the Redis backend alone (``InterestLookup``), per queue (a topic queue or a wildcard
filter's queue) the nodes with interested sessions, which the store node reads from the same
Redis to send notify events only there. (The embedded lookup is partitioned over the gateway
nodes, of which the store node is none: it routes by the nodes' reading hints alone, so that
lookup keeps no interest nobody would read.) Every instance also keeps the live state of its
own node (the ``LocalRegistry``) and re-registers it whenever the shared copy may have lost it:
the data is rebuilt from live connections, never replicated. Whenever an answer cannot be
trusted it is "in doubt": the client calls return ``IN_DOUBT`` (send the takeover to every
node) and ``nodes_for`` returns None (send the notify to every node). Lookup trouble never raises.

Usage, for a node ``node_id`` (``lookup.node_id``)::

    await lookup.start()                            # heartbeats, expiry, re-registration
    prev = await lookup.client_online("dev-1")      # str: kick it there; None; IN_DOUBT: kick everywhere
    await lookup.client_offline("dev-1")            # removed only if still registered to this node
    await lookup.where_is("dev-1")                  # str | None | IN_DOUBT
    await lookup.clients(prefix="dev-", limit=100)  # ClientList(clients, complete)
    lookup.nodes()                                  # the nodes to broadcast to
    lookup.stats.snapshot()                         # counters for /metrics
    await lookup.close()

and with an ``InterestLookup`` (Redis)::

    await lookup.add_interest("sensors/+/temp")     # counted per queue; True once Redis has it
    await lookup.remove_interest("sensors/+/temp")
    await lookup.nodes_for("sensors/+/temp")        # frozenset of nodes, or None: broadcast
"""

from __future__ import annotations

import abc
import enum
import heapq
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field


class InDoubt(enum.Enum):
    """The type of ``IN_DOUBT``: a client answer that cannot be trusted."""

    IN_DOUBT = "in doubt"

    def __repr__(self) -> str:
        return "IN_DOUBT"


IN_DOUBT = InDoubt.IN_DOUBT


class FallbackReason(enum.StrEnum):
    """Why an answer was in doubt; the label of the ``broadcast_fallbacks`` counter."""

    SETTLING = "settling"  # membership changed lately, nodes disagree on it, or the backend just came back
    REBUILDING = "rebuilding"  # the owner (or Redis) has not got every node's re-registration yet
    DEADLINE = "deadline"  # the owner (or Redis) did not answer within the deadline
    UNREACHABLE = "unreachable"  # connection refused or lost: the owner or Redis is down
    UNSYNCED = "unsynced"  # a write to the owner failed and is not repaired yet


@dataclass(slots=True)
class LookupOptions:
    """Tunables of both backends; seconds throughout.

    ``heartbeat_s``: how often a node heart-beats (peers or Redis) and repairs what failed.
    ``node_ttl_s``: a node silent this long is gone and its entries stop counting.
    ``settle_s``: answers stay in doubt this long after a membership change (or after Redis
    comes back); at least two heartbeats, so that every node has seen the change.
    ``deadline_s``: the longest a lookup call waits for the owner (or Redis).
    ``vnodes``/``slot_bits``: the ring (embedded backend); equal on every node, or the nodes
    never agree on a view and every answer stays in doubt.
    """

    heartbeat_s: float = 1.0
    node_ttl_s: float = 5.0
    settle_s: float = 2.5
    deadline_s: float = 0.25
    vnodes: int = 160
    slot_bits: int = 14
    list_deadline_s: float = 2.0  # clients(): a listing for ctl may take longer than a lookup

    def __post_init__(self) -> None:
        if self.node_ttl_s <= self.heartbeat_s:
            raise ValueError("node_ttl_s must exceed heartbeat_s, or live nodes expire between heartbeats")
        if min(self.heartbeat_s, self.deadline_s, self.settle_s) <= 0:
            raise ValueError("heartbeat_s, deadline_s and settle_s must be positive")


@dataclass(slots=True)
class LookupStats:
    """Counters a user would graph: ``lookups`` (where_is and nodes_for calls) and the
    ``broadcast_fallbacks`` among them by reason; write failures; re-registrations."""

    lookups: int = 0
    broadcast_fallbacks: Counter[str] = field(default_factory=Counter)
    write_failures: int = 0
    resyncs: int = 0

    def fallback(self, reason: FallbackReason) -> None:
        self.broadcast_fallbacks[reason.value] += 1

    @property
    def fallbacks(self) -> int:
        return sum(self.broadcast_fallbacks.values())

    def snapshot(self) -> dict[str, object]:
        return {"lookups": self.lookups, "broadcast_fallbacks": dict(self.broadcast_fallbacks),
                "write_failures": self.write_failures, "resyncs": self.resyncs}


@dataclass(slots=True, frozen=True)
class ClientList:
    """``clients()``: (client id, node) pairs sorted by client id; ``complete`` is False when a
    part of the lookup did not answer (the list may miss clients, never hold wrong ones)."""

    clients: list[tuple[str, str]]
    complete: bool


class LocalRegistry:
    """The live state of this node: its connected clients and (``InterestLookup``) its
    interests, counted per queue. It is the truth the shared copy is rebuilt from."""

    __slots__ = ("clients", "interests")

    def __init__(self) -> None:
        self.clients: set[str] = set()
        self.interests: dict[str, int] = {}

    def add_interest(self, queue: str) -> bool:
        """Count one more interest; True when it is the first for ``queue``."""
        count = self.interests.get(queue, 0)
        self.interests[queue] = count + 1
        return count == 0

    def remove_interest(self, queue: str) -> bool:
        """Count one interest less; True when it was the last for ``queue``."""
        count = self.interests.get(queue, 0)
        if count <= 1:
            self.interests.pop(queue, None)
            return count == 1
        self.interests[queue] = count - 1
        return False

    def __len__(self) -> int:
        return len(self.clients) + len(self.interests)


class Lookup(abc.ABC):
    """Online state of the cluster. ``node_id`` arguments default to this instance's node; an
    instance registers the connections of its own node only (they are what it re-registers)."""

    node_id: str
    options: LookupOptions
    stats: LookupStats

    @abc.abstractmethod
    async def start(self) -> None:
        """Start heart-beating; the first answers may be in doubt until the membership settles."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop heart-beating; the entries of this node expire with it."""

    @abc.abstractmethod
    async def client_online(self, client_id: str, node_id: str | None = None) -> str | None | InDoubt:
        """Register a connected client. Returns the node it was registered to before (the
        caller disconnects it there), None when it was nowhere else, or IN_DOUBT when that
        cannot be known (the caller disconnects it on every other node)."""

    @abc.abstractmethod
    async def client_offline(self, client_id: str, node_id: str | None = None) -> None:
        """Forget a client, unless it has been taken over by another node since."""

    @abc.abstractmethod
    async def where_is(self, client_id: str) -> str | None | InDoubt:
        """The node a client is connected to, None when it is offline, IN_DOUBT when unknown."""

    @abc.abstractmethod
    async def clients(self, prefix: str = "", limit: int = 100) -> ClientList:
        """Online clients whose id starts with ``prefix``, at most ``limit``, for ctl."""

    @abc.abstractmethod
    def nodes(self) -> frozenset[str]:
        """The live nodes as last known, this one included: the targets of a broadcast."""

    @abc.abstractmethod
    async def heartbeat(self) -> None:
        """One heartbeat round (what ``start`` runs every ``heartbeat_s``): refresh this node's
        liveness, expire silent nodes, re-register what may have been lost."""


class InterestLookup(Lookup):
    """A lookup that also keeps, per queue, the nodes with interested sessions, for a reader
    that is not one of the gateway nodes: the store node's notify routing
    (``gateway/cluster/notify_router.py``) asks ``nodes_for``. A gateway node registers its
    interests only with a lookup of this kind."""

    @abc.abstractmethod
    async def add_interest(self, queue: str, node_id: str | None = None) -> bool:
        """This node has (one more) session interested in ``queue``. True when the shared copy
        has it; False when it could not be written, and it is repaired in the background
        (until then readers are in doubt where the backend can tell them so)."""

    @abc.abstractmethod
    async def remove_interest(self, queue: str, node_id: str | None = None) -> None:
        """One session less interested in ``queue``; the shared copy hears of the last one."""

    @abc.abstractmethod
    async def nodes_for(self, queue: str) -> frozenset[str] | None:
        """The nodes to send a notify event of ``queue`` to; None: in doubt, send it to all."""


def smallest(pairs: Iterator[tuple[str, str]], limit: int) -> list[tuple[str, str]]:
    """The ``limit`` pairs with the smallest client ids, sorted: one rule for both backends."""
    return heapq.nsmallest(max(limit, 0), pairs)
