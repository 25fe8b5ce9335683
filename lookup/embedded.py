"""The embedded lookup: the KV partitioned over the gateway nodes themselves, no external
service. Each node owns the slots the ring gives it (``OwnerTable``); calls about keys owned
elsewhere go to the owner over a ``Transport`` within ``deadline_s``.

Membership: every node heart-beats every node of the transport's address book; a node silent
for ``node_ttl_s`` is gone. Heartbeats also carry the sender's view (a digest of members and
their incarnations), which owners have its re-registration, and which owners it failed to write
to, so the nodes can tell when the mapping is not to be trusted.

It keeps client id -> node only: queue interest is kept by the Redis backend alone, whose copy
the store node reads to route notify events; the store node is no member of this ring and
routes by the gateway nodes' reading hints instead (``gateway/cluster/notify_router.py``).

Rebuild (no replication): after every membership change each node re-registers its live clients
with every owner (a ``sync``, replacing all that owner holds for the node), and an owner drops
what it no longer owns. Requests carry the sender's view; an owner refuses those
whose view differs from its own, and answers in doubt until it has the sync of every member.

In doubt (``where_is``/``client_online`` -> IN_DOUBT, ``clients`` incomplete), by reason:
SETTLING while the membership changed within ``settle_s`` or a live member reports another view;
REBUILDING while the owner lacks a member's sync; UNSYNCED while some node reports a failed write
to the owner not yet repaired by a sync; DEADLINE or UNREACHABLE when the owner does not answer.

Writes from one node to one owner go through one ordered outbox (batched), so a sync and the
writes after it arrive in order; a write that fails marks the owner unsynced until a sync to it
succeeds, and that is announced to the other nodes at once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any


from .api import (
    IN_DOUBT,
    ClientList,
    FallbackReason,
    InDoubt,
    LocalRegistry,
    Lookup,
    LookupOptions,
    LookupStats,
    smallest,
)
from .heartbeats import beat_until_closed, stop_tasks
from .outbox import SYNC, Outbox, Result, resolve
from .ring import Membership
from .table import OwnerTable
from .transport import Request, Transport

log = logging.getLogger("tidemq.lookup")

_SYNC_CHUNK = 5000  # entries per sync request


def _now() -> float:
    return time.monotonic()  # the event loop's clock too


class EmbeddedLookup(Lookup):
    def __init__(self, node_id: str, transport: Transport, options: LookupOptions | None = None,
                 *, incarnation: str | None = None) -> None:
        self.node_id = node_id
        self.options = options or LookupOptions()
        self.stats = LookupStats()
        self.incarnation = incarnation or secrets.token_hex(6)
        self._transport = transport
        transport.bind(self.handle)
        self._registry = LocalRegistry()
        self._table = OwnerTable()
        opts = self.options
        self._membership = Membership(node_id, self.incarnation, now=_now(), node_ttl=opts.node_ttl_s,
                                      settle=opts.settle_s, vnodes=opts.vnodes, slot_bits=opts.slot_bits)
        self._epoch_seen = 0
        self._synced_from: set[str] = set()  # owner side: members whose sync we hold for this view
        self._synced_to: dict[str, str] = {}  # peer -> the view in which it accepted our sync
        self._sync_queued: set[str] = set()
        self._dirty: set[str] = set()  # owners a write of ours failed to reach
        self._peer_views: dict[str, str] = {}
        self._peer_dirty: dict[str, frozenset[str]] = {}
        self._outboxes: dict[str, Outbox] = {}
        self._task: asyncio.Task[None] | None = None
        self._announce: asyncio.Task[None] | None = None
        self._closed = False
        self._after_membership()

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        await self._transport.start()
        await self.heartbeat()
        self._task = asyncio.create_task(self._run(), name=f"lookup-heartbeat-{self.node_id}")

    async def close(self, leave: bool = True) -> None:
        """Stop; with ``leave`` the peers drop this node at once instead of after its TTL."""
        if self._closed:
            return
        self._closed = True
        await stop_tasks(task for task in (self._task, self._announce) if task is not None)
        outboxes = list(self._outboxes.values())
        self._outboxes.clear()
        for outbox in outboxes:
            outbox.close()
        await asyncio.gather(*(outbox.task for outbox in outboxes), return_exceptions=True)
        if leave:
            message = {"op": "leave", "node": self.node_id, "inc": self.incarnation}
            await asyncio.gather(*(self._call(p, message) for p in self._membership.members - {self.node_id}))
        await self._transport.close()

    async def _run(self) -> None:
        await beat_until_closed(lambda: self._closed, self.options.heartbeat_s, self.heartbeat, self.node_id)

    async def heartbeat(self) -> None:
        peers = self._transport.peers() - {self.node_id}
        await asyncio.gather(*(self._heartbeat_peer(p) for p in peers))
        self._membership.expire(_now())
        self._after_membership()
        self._schedule_syncs()

    async def _heartbeat_peer(self, peer: str) -> None:
        reply = await self._call(peer, self._heartbeat_message())
        if isinstance(reply, dict):
            self._on_heartbeat(reply)

    def nodes(self) -> frozenset[str]:
        return self._membership.members

    @property
    def epoch(self) -> int:
        return self._membership.epoch

    @property
    def view(self) -> str:
        return self._membership.view

    # -- the API --------------------------------------------------------------------------
    async def client_online(self, client_id: str, node_id: str | None = None) -> str | None | InDoubt:
        self._own(node_id)
        self._registry.clients.add(client_id)
        status, value = await self._write(client_id, ("online", client_id))
        return value if status == "ok" else IN_DOUBT

    async def client_offline(self, client_id: str, node_id: str | None = None) -> None:
        self._own(node_id)
        self._registry.clients.discard(client_id)
        await self._write(client_id, ("offline", client_id))

    async def where_is(self, client_id: str) -> str | None | InDoubt:
        answer = await self._get("client", client_id)
        return IN_DOUBT if isinstance(answer, FallbackReason) else answer

    async def clients(self, prefix: str = "", limit: int = 100) -> ClientList:
        request = {"op": "list", "prefix": prefix, "limit": limit}
        members = sorted(self._membership.members)
        replies = await asyncio.gather(*(
            self._list_local(prefix, limit) if n == self.node_id
            else self._call(n, request, self.options.list_deadline_s) for n in members))
        pairs: list[tuple[str, str]] = []
        complete = self._local_doubt() is None
        for reply in replies:
            if not isinstance(reply, dict):
                complete = False
                continue
            complete = complete and reply["complete"]
            pairs.extend((c, n) for c, n in reply["clients"])
        return ClientList(smallest(iter(pairs), limit), complete)

    async def _list_local(self, prefix: str, limit: int) -> Request:
        return self._answer_list({"prefix": prefix, "limit": limit})

    def _own(self, node_id: str | None) -> None:
        if node_id is not None and node_id != self.node_id:
            raise ValueError(f"lookup of node {self.node_id!r} cannot register connections of {node_id!r}")

    # -- reads ----------------------------------------------------------------------------
    async def _get(self, kind: str, key: str) -> Any:
        """The owner's answer, or the FallbackReason why there is none (counted)."""
        self.stats.lookups += 1
        reason = self._local_doubt()
        owner = self._membership.ring.owner(key)
        assert owner is not None  # (the membership always holds this node)
        if reason is None and self._unsynced(owner):
            reason = FallbackReason.UNSYNCED
        if reason is None:
            request = {"op": "get", "kind": kind, "key": key, "view": self._membership.view}
            reply = self._answer_get(request) if owner == self.node_id else await self._call(owner, request)
            if isinstance(reply, FallbackReason):
                reason = reply
            elif "doubt" in reply:
                reason = FallbackReason(reply["doubt"])
            else:
                return reply["value"]
        self.stats.fallback(reason)
        return reason

    def _unsynced(self, owner: str | None) -> bool:
        """Has some node (this one included) a failed write to ``owner`` not yet repaired?"""
        return owner in self._dirty or any(owner in d for d in self._peer_dirty.values())

    def _local_doubt(self) -> FallbackReason | None:
        view = self._membership.view
        if self._membership.settling(_now()) or any(v != view for v in self._peer_views.values()):
            return FallbackReason.SETTLING
        return None

    async def _call(self, peer: str, request: Request, deadline: float | None = None) -> Request | FallbackReason:
        try:
            async with asyncio.timeout(deadline or self.options.deadline_s):
                return await self._transport.call(peer, request)
        except TimeoutError:
            return FallbackReason.DEADLINE
        except OSError:
            return FallbackReason.UNREACHABLE

    # -- writes ---------------------------------------------------------------------------
    async def _write(self, key: str, op: tuple[str, ...]) -> Result:
        """Apply ``op`` at the owner of ``key``. An ``online`` result is in doubt too when
        the owner may miss a takeover (it is rebuilding, or unsynced)."""
        if self._closed:
            return ("doubt", FallbackReason.SETTLING.value)
        owner = self._membership.ring.owner(key)
        if owner == self.node_id:
            result = self._apply(self.node_id, op)
            reason = self._local_doubt() or self._owner_doubt()
            if reason is not None and op[0] == "online":
                return ("doubt", reason.value)
        else:
            assert owner is not None  # this node is always a member
            outbox = self._outboxes.get(owner)
            if outbox is None:
                outbox = self._outboxes[owner] = Outbox(self, owner)
            result = await outbox.submit(op)
        if op[0] == "online" and result[0] == "ok" and self._unsynced(owner):
            return ("doubt", FallbackReason.UNSYNCED.value)
        return result

    def _schedule_syncs(self) -> None:
        view = self._membership.view
        for peer in self._membership.members - {self.node_id}:
            if self._synced_to.get(peer) != view or peer in self._dirty:
                self._schedule_sync(peer)

    def _schedule_sync(self, peer: str) -> None:
        if peer in self._sync_queued or self._closed or peer not in self._membership.members:
            return
        self._sync_queued.add(peer)
        outbox = self._outboxes.get(peer)
        if outbox is None:
            outbox = self._outboxes[peer] = Outbox(self, peer)
        outbox.submit(SYNC)

    def _snapshot_for(self, owner: str) -> list[str]:
        ring = self._membership.ring
        return [c for c in self._registry.clients if ring.owner(c) == owner]

    async def _send_batch(self, peer: str, batch: list[tuple[tuple[str, ...], asyncio.Future[Result]]]) -> None:
        results = await self._request_ops(peer, self._membership.view, [list(op) for op, _ in batch])
        if isinstance(results, FallbackReason):
            resolve(batch, results)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(tuple(result))

    async def _send_sync(self, peer: str, future: asyncio.Future[Result]) -> None:
        """Re-register this node's live state with ``peer``, in chunks of ``_SYNC_CHUNK``
        entries: the first replaces what the owner holds for this node, the last makes it count."""
        view = self._membership.view
        clients = self._snapshot_for(peer)
        self.stats.resyncs += 1
        parts = max(1, -(-len(clients) // _SYNC_CHUNK))
        result: Result = ("ok", None)
        for i in range(parts):
            op = ["sync", clients[i * _SYNC_CHUNK:(i + 1) * _SYNC_CHUNK], i == 0, i == parts - 1]
            reply = await self._request_ops(peer, view, [op])
            if isinstance(reply, FallbackReason):
                result = ("doubt", reply.value)
                break
        else:
            if view == self._membership.view:
                self._synced_to[peer] = view
                self._dirty.discard(peer)
        self._sync_queued.discard(peer)
        if not future.done():
            future.set_result(result)

    async def _request_ops(self, peer: str, view: str, ops: list[list[Any]]) -> list[Any] | FallbackReason:
        """One batch request; on failure the owner is marked unsynced and that announced."""
        reply = await self._call(peer, {"op": "batch", "node": self.node_id, "view": view, "ops": ops})
        if isinstance(reply, dict) and "doubt" in reply:
            reply = FallbackReason(reply["doubt"])
        if isinstance(reply, FallbackReason):
            self.stats.write_failures += 1
            if peer in self._membership.members:
                self._dirty.add(peer)
                self._announce_dirty()
            return reply
        return reply["results"]

    def _announce_dirty(self) -> None:
        """Tell every node now, not at the next heartbeat, that an owner missed a write."""
        if self._announce is None or self._announce.done():
            self._announce = asyncio.create_task(self._announce_now())

    async def _announce_now(self) -> None:
        message = self._heartbeat_message()
        peers = self._membership.members - {self.node_id}
        replies = await asyncio.gather(*(self._call(p, message) for p in peers))
        for reply in replies:
            if isinstance(reply, dict):
                self._on_heartbeat(reply)

    # -- membership -----------------------------------------------------------------------
    def _heartbeat_message(self) -> Request:
        return {"op": "heartbeat", "node": self.node_id, "inc": self.incarnation, "view": self._membership.view,
                "synced": sorted(self._synced_from), "dirty": sorted(self._dirty)}

    def _on_heartbeat(self, message: Request) -> None:
        node = message["node"]
        if node == self.node_id:
            return
        self._membership.heartbeat(node, message["inc"], _now())
        self._after_membership()
        self._peer_views[node] = message["view"]
        self._peer_dirty[node] = frozenset(message["dirty"])
        view = self._membership.view
        if message["view"] == view and self.node_id not in message["synced"]:
            if self._synced_to.get(node) == view:  # it restarted its rebuild, or never got ours
                del self._synced_to[node]
            self._schedule_sync(node)

    def _after_membership(self) -> None:
        """Apply a membership change: keep only what this node owns, expect every member's sync
        again, re-register this node's own live state with every owner."""
        membership = self._membership
        if membership.epoch == self._epoch_seen:
            return
        self._epoch_seen = membership.epoch
        members, ring = membership.members, membership.ring
        log.info("lookup membership node=%s epoch=%d members=%d view=%s", self.node_id, membership.epoch,
                 len(members), membership.view[:8])
        self._table.retain(lambda key: ring.owner(key) == self.node_id, members)
        self._table.replace(self.node_id, self._snapshot_for(self.node_id))
        self._synced_from = {self.node_id}
        self._synced_to = {self.node_id: membership.view}
        for gone in set(self._outboxes) - members:
            self._outboxes.pop(gone).close()
        self._peer_views = {n: v for n, v in self._peer_views.items() if n in members}
        self._peer_dirty = {n: d for n, d in self._peer_dirty.items() if n in members}
        self._dirty &= members
        self._schedule_syncs()

    # -- the owner's side -----------------------------------------------------------------
    async def handle(self, request: Request) -> Request:
        """Answer a peer's request (the transport calls this, in arrival order)."""
        op = request.get("op")
        if op == "heartbeat":
            self._on_heartbeat(request)
            return self._heartbeat_message()
        if op == "leave":
            if self._membership.incarnation_of(request["node"]) == request["inc"]:
                self._membership.leave(request["node"], _now())
                self._after_membership()
            return {}
        if op == "batch":
            return self._answer_batch(request)
        if op == "get":
            return self._answer_get(request)
        if op == "list":
            return self._answer_list(request)
        raise ValueError(f"unknown lookup request {op!r}")

    def _owner_doubt(self) -> FallbackReason | None:
        if self._membership.settling(_now()):
            return FallbackReason.SETTLING
        if not self._membership.members <= self._synced_from:
            return FallbackReason.REBUILDING
        return None

    def _answer_get(self, request: Request) -> Request:
        if request["view"] != self._membership.view:
            return {"doubt": FallbackReason.SETTLING.value}
        reason = self._owner_doubt()
        if reason is not None:
            return {"doubt": reason.value}
        if request["kind"] != "client":
            raise ValueError(f"unknown lookup key kind {request['kind']!r}")
        return {"value": self._table.where(request["key"])}

    def _answer_batch(self, request: Request) -> Request:
        node = request["node"]
        if request["view"] != self._membership.view or node not in self._membership.members:
            return {"doubt": FallbackReason.SETTLING.value}
        results = [self._apply(node, tuple(op)) for op in request["ops"]]
        reason = self._owner_doubt()
        if reason is not None:  # applied, but a previous holder may be unknown
            results = [("doubt", reason.value) if op[0] == "online" else r for op, r in zip(request["ops"], results)]
        return {"results": results}

    def _apply(self, node: str, op: tuple[Any, ...]) -> Result:
        kind = op[0]
        if kind == "online":
            return ("ok", self._table.online(op[1], node))
        if kind == "offline":
            self._table.offline(op[1], node)
        elif kind == "sync":  # clients, first chunk, last chunk
            if op[2]:
                self._synced_from.discard(node)
                self._table.replace(node, op[1])
            else:
                self._table.extend(node, op[1])
            if op[3]:
                self._synced_from.add(node)
        else:
            raise ValueError(f"unknown lookup op {kind!r}")
        return ("ok", None)

    def _answer_list(self, request: Request) -> Request:
        complete = self._local_doubt() is None and self._owner_doubt() is None
        return {"clients": self._table.list_clients(request["prefix"], request["limit"]), "complete": complete}
