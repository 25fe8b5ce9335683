"""Leadership of a replicated store group, kept in etcd (aetcd client).

Keys under ``{prefix}/{group}/``: ``leader`` (the leader's addresses, on its lease: it goes when
the leader stops renewing) and ``state`` ({epoch, leader, in_sync}: changed only by
compare-and-swap transactions). A node may become leader only when no one is, and only if it
was the last leader or one of its in-sync followers: each holds everything ever confirmed
(``may_lead``). Winning bumps the epoch, the fencing token every replication frame carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aetcd

from store import InSyncSet

from ..tasks import cancel_and_wait

log = logging.getLogger("tidemq.cluster.election")

POLL_S = 0.1  # how often the leader key is read while waiting


@dataclass(slots=True, frozen=True)
class GroupState:
    epoch: int
    leader: str
    in_sync: frozenset[str] = field(default_factory=frozenset)

    def encode(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "leader": self.leader, "in_sync": sorted(self.in_sync)}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> GroupState:
        data = json.loads(raw)
        return cls(int(data["epoch"]), str(data["leader"]), frozenset(data.get("in_sync", ())))


def may_lead(state: GroupState | None, node: str) -> bool:
    """Whether ``node`` holds everything the group ever confirmed: the group's first leader (no
    state yet), its last leader, or one of that leader's in-sync followers."""
    return state is None or node == state.leader or node in state.in_sync


def next_state(state: GroupState | None, node: str) -> GroupState:
    """The group once ``node`` leads: a newer epoch; the others in sync stay so (they hold all
    that was confirmed); the last leader leaves the set until it has caught up with the new one."""
    if state is None:
        return GroupState(1, node)
    return GroupState(state.epoch + 1, node, state.in_sync - {node, state.leader})


class EtcdGroup:
    """The group's keys in etcd, for one node."""

    def __init__(self, endpoint: tuple[str, int], group: str, node: str, prefix: str = "/tidemq/groups") -> None:
        self.endpoint = endpoint
        self.node = node
        base = f"{prefix}/{group}/"
        self.leader_key = (base + "leader").encode()
        self.state_key = (base + "state").encode()
        self.node_prefix = (base + "nodes/").encode()
        self.client = aetcd.Client(host=endpoint[0], port=endpoint[1], timeout=5)

    async def close(self) -> None:
        await self.client.close()

    async def state(self) -> tuple[GroupState | None, int]:
        """The group's state and its mod revision (0: no state yet)."""
        got = await self.client.get(self.state_key)
        if got is None:
            return None, 0
        return GroupState.decode(got.value), got.mod_revision

    async def leader(self) -> dict[str, Any] | None:
        got = await self.client.get(self.leader_key)
        return json.loads(got.value) if got is not None else None

    async def campaign(self, lease: Any, info: dict[str, Any]) -> GroupState | None:
        """Become the leader if no one is and the state is still as read; the new state, or None."""
        state, revision = await self.state()
        if not may_lead(state, self.node):
            return None
        new = next_state(state, self.node)
        txn = self.client.transactions
        ok, _ = await self.client.transaction(
            compare=[txn.create(self.leader_key) == 0, txn.mod(self.state_key) == revision],
            success=[txn.put(self.leader_key, json.dumps({**info, "node": self.node, "epoch": new.epoch}).encode(),
                             lease=lease),
                     txn.put(self.state_key, new.encode())],
            failure=[])
        return new if ok else None

    async def replace_in_sync(self, epoch: int, old: frozenset[str], new: frozenset[str]) -> bool:
        """Change the in-sync set, if this node still leads ``epoch`` and the set is ``old``."""
        state, revision = await self.state()
        if state is None or state.epoch != epoch or state.leader != self.node or state.in_sync != old:
            return False
        txn = self.client.transactions
        ok, _ = await self.client.transaction(
            compare=[txn.mod(self.state_key) == revision],
            success=[txn.put(self.state_key, GroupState(epoch, self.node, new).encode())], failure=[])
        return bool(ok)

    async def publish_node(self, lease: Any, info: dict[str, Any]) -> None:
        """This node's own record (addresses, role, log end) on its lease, for ``ctl cluster``."""
        await self.client.put(self.node_prefix + self.node.encode(), json.dumps(info).encode(), lease=lease)

    async def nodes(self) -> dict[str, dict[str, Any]]:
        out = {}
        for kv in await self.client.get_prefix(self.node_prefix):
            out[kv.key[len(self.node_prefix):].decode()] = json.loads(kv.value)
        return out

    async def view(self) -> list[dict[str, Any]]:
        """One row per store node the group knows (its own record, or only its place in the
        state when it is down): role, epoch, in sync or not, log end, and as the leader sees
        it each follower's lag in bytes and seconds (``tidemq ctl cluster``)."""
        state, _ = await self.state()
        nodes = await self.nodes()
        leader = nodes.get(state.leader, {}) if state is not None else {}
        lags = leader.get("followers", {}) if leader.get("role") == "leader" else {}
        names = sorted(set(nodes) | ({state.leader} | state.in_sync if state is not None else set()))
        rows = []
        for name in names:
            record = nodes.get(name)
            lag = lags.get(name, {})
            rows.append({
                "node": name, "role": record.get("role", "?") if record else "down",
                "epoch": record.get("epoch") if record else None,
                "group_epoch": state.epoch if state is not None else None,
                "in_sync": "leader" if state is not None and name == state.leader else
                           (state is not None and name in state.in_sync),
                "end": record.get("end") if record else None,
                "lag_bytes": lag.get("lag_bytes"), "lag_s": lag.get("lag_s"),
                "replication": record.get("replication") if record else None,
            })
        return rows


class LeaderFinder:
    """Where a group's leader serves, for gateway nodes: its store link (remoting) address and
    its AMQP address, read from the leader key; waits for an election when there is none."""

    def __init__(self, endpoint: tuple[str, int], group: str) -> None:
        self._group = EtcdGroup(endpoint, group, node="")

    async def address(self, service: str, timeout_s: float) -> tuple[str, int]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                leader = await self._group.leader()
            except Exception as exc:  # (etcd down: as no leader, until the deadline)
                log.warning("etcd unreachable error=%s", exc)
                leader = None
            text = str((leader or {}).get(service) or "")
            if text:
                host, _, port = text.rpartition(":")
                return host.strip("[]"), int(port)
            if time.monotonic() >= deadline:
                raise OSError(f"the replication group has no leader serving {service} (etcd {self._group.endpoint})")
            await asyncio.sleep(POLL_S)

    async def view(self) -> list[dict[str, Any]]:
        return await self._group.view()

    async def close(self) -> None:
        await self._group.close()


class EtcdInSyncSet(InSyncSet):
    """The in-sync set of the group's state in etcd, changed by compare-and-swap while this
    node leads ``epoch``."""

    def __init__(self, group: EtcdGroup, epoch: int, members: frozenset[str]) -> None:
        super().__init__(members)
        self._group = group
        self._epoch = epoch

    async def replace(self, old: frozenset[str], new: frozenset[str]) -> bool:
        if self.members != old:
            return False
        try:
            ok = await self._group.replace_in_sync(self._epoch, old, new)
        except Exception as exc:  # (etcd unreachable: the set stays as it was, and writes wait)
            log.warning("in-sync set not changed: etcd error=%s", exc)
            return False
        if ok:
            self.members = new
        return ok


class Elector:
    """Keeps this node's lease, campaigns when the group has no leader, and says what to be:
    ``on_lead(state)`` when it won, ``on_follow(leader info)`` when another leads (again after
    each change), ``on_lost()`` when its leadership ended (its lease could not be renewed in
    time: another node may lead already)."""

    def __init__(self, group: EtcdGroup, info: dict[str, Any], *, lease_s: float,
                 on_lead: Callable[[GroupState], Awaitable[None]],
                 on_follow: Callable[[dict[str, Any]], Awaitable[None]],
                 on_lost: Callable[[], Awaitable[None]],
                 status: Callable[[], dict[str, Any]] | None = None) -> None:
        self.group = group
        self.info = info
        self.lease_s = lease_s
        self._on_lead = on_lead
        self._on_follow = on_follow
        self._on_lost = on_lost
        self._status = status
        self.state: GroupState | None = None  # set while this node leads
        self.leader_info: dict[str, Any] | None = None  # the leader, as last read
        self._renewed = 0.0  # when the lease was last renewed (monotonic)
        self._task: asyncio.Task[None] | None = None

    def leads_now(self) -> bool:
        """Whether this node leads and its lease was renewed recently enough that no other node
        can lead yet: false at once in a process resumed after a stop past its lease, before
        the election's own check has run (what acts outside the store asks this first)."""
        return self.state is not None and time.monotonic() - self._renewed <= self.lease_s * 0.8

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="store-election")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def _run(self) -> None:
        lapsed = None  # the lease this node lost hold of, revoked once etcd grants a new one
        while True:
            lease = None
            try:
                lease = await self.group.client.lease(max(1, round(self.lease_s)))
                if lapsed is not None:  # (etcd answers again: what the old lease held -- the leader key
                    # of a leader that stepped down -- goes now, not when etcd lets the lease run out)
                    with contextlib.suppress(Exception):  # (gone already: it ran out)
                        await lapsed.revoke()
                    lapsed = None
                await self._hold(lease)
            except asyncio.CancelledError:
                if lease is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(lease.revoke())  # (a clean stop: the next leader need not wait)
                raise
            except Exception as exc:
                log.warning("lease lost, etcd unreachable or leading failed error=%r", exc)
                if lease is not None:
                    lapsed = lease
            if self.state is not None:
                self.state = None
                await self._on_lost()
            await asyncio.sleep(POLL_S)

    async def _hold(self, lease: Any) -> None:
        """While the lease lives: renew it in a task of its own (so that what this node does on
        winning or on a new leader, however long it takes, never delays a renewal), and follow
        or campaign."""
        self._renewed = time.monotonic()
        renewing = asyncio.get_running_loop().create_task(self._renew(lease), name="store-lease")
        try:
            while not renewing.done():
                if self.state is None:
                    await self._elect(lease)
                await asyncio.wait([renewing], timeout=POLL_S)
            renewing.result()  # (how the lease ended)
        finally:
            await cancel_and_wait([renewing])

    async def _renew(self, lease: Any) -> None:
        """Renew the lease every sixth of it (so that one slow answer of a busy etcd does not end
        it) and publish this node beside, never in the way of, the renewal; raise once the lease
        may have run out."""
        renewed = self._renewed
        last_publish = 0.0
        publishing: asyncio.Task[None] | None = None
        try:
            while True:
                now = time.monotonic()
                if now - renewed > self.lease_s * 0.8:  # (a process stopped past its lease: it may have lapsed)
                    raise TimeoutError(f"lease not renewed for {now - renewed:.1f} s")
                try:  # (etcd unreachable a moment: asked again until the lease may have run out)
                    async with asyncio.timeout(max(0.0, renewed + self.lease_s * 0.8 - now)):  # (a hung etcd)
                        answer = await lease.refresh()
                except TimeoutError:
                    raise
                except Exception as exc:  # (aetcd's connection errors)
                    log.debug("lease not renewed yet error=%s", exc)
                    await asyncio.sleep(POLL_S)
                    continue
                if getattr(answer, "TTL", 1) <= 0:
                    raise TimeoutError("the lease expired")
                renewed = self._renewed = now  # (when it was asked: etcd renewed it after that)
                if self._status is not None and now - last_publish >= self.lease_s / 4 and \
                        (publishing is None or publishing.done()):
                    last_publish = now
                    publishing = asyncio.get_running_loop().create_task(self._publish(lease))
                await asyncio.sleep(self.lease_s / 6)
        finally:
            if publishing is not None:
                await cancel_and_wait([publishing])

    async def _publish(self, lease: Any) -> None:
        assert self._status is not None
        try:
            await self.group.publish_node(lease, {**self.info, **self._status()})
        except Exception as exc:
            log.warning("node record not published error=%s", exc)

    async def _elect(self, lease: Any) -> None:
        leader = await self.group.leader()
        if leader is None:
            state = await self.group.campaign(lease, self.info)
            if state is not None:
                self.state = state
                self.leader_info = {**self.info, "node": self.group.node, "epoch": state.epoch}
                log.info("elected leader node=%s epoch=%d in_sync=%s", self.group.node, state.epoch,
                         sorted(state.in_sync))
                await self._on_lead(state)
            return
        if leader != self.leader_info:
            self.leader_info = leader
            log.info("following leader node=%s epoch=%s", leader.get("node"), leader.get("epoch"))
            await self._on_follow(leader)
