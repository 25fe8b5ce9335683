"""A store node's membership of a replicated group: the election in etcd (election.py) decides,
the store's replica (store/replica/node.py) follows or leads, and the node serves its clients
(protocol listeners, the store link) only while it leads.

Leading: the store leads the new epoch with the group's in-sync set, then ``serve()`` starts the
listeners. Losing the lease: ``unserve()`` closes them (clients reconnect to the new leader)
before the store turns follower, so nothing is acknowledged from here after another may lead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from store import InSyncSet, MessageStore, ReplicaNode, ReplicaSettings

from ..config import Config, parse_bind
from .election import Elector, EtcdGroup, EtcdInSyncSet, GroupState

log = logging.getLogger("tidemq.cluster.store_group")


def replica_settings(cfg: Config) -> ReplicaSettings:
    return ReplicaSettings(cfg.node_id, mode=cfg.replication, min_insync=cfg.min_insync_replicas,  # type: ignore[arg-type]
                           lag_s=cfg.replication_lag_s, timeout_s=cfg.replication_timeout_s, token=cfg.cluster_token)


def parse_address(text: str) -> tuple[str, int] | None:
    if not text:
        return None
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class StoreGroupMember:
    """``start()`` once the store is open; ``stop()`` before it closes. ``advertised``: this
    node's addresses for clients and gateway nodes (remoting, AMQP), published when it leads."""

    def __init__(self, cfg: Config, store: MessageStore, advertised: dict[str, str],
                 serve: Callable[[], Awaitable[None]], unserve: Callable[[], Awaitable[None]],
                 reopen: Callable[[], Awaitable[MessageStore]]) -> None:
        bind = parse_bind(cfg.replication_bind, "replication_bind")
        etcd = parse_bind(cfg.etcd_endpoint, "etcd_endpoint")
        assert bind is not None and etcd is not None
        self._bind = bind
        self._advertise = cfg.replication_advertise
        self.replica = self._replica(store, replica_settings(cfg))
        self.group = EtcdGroup(etcd, cfg.replication_group, cfg.node_id)
        self._advertised = advertised
        self._serve = serve
        self._unserve = unserve
        self._reopen = reopen  # close the store and open it again (installs a seed)
        self._reseeding: asyncio.Task[None] | None = None
        self.serving = False
        self.elector = Elector(self.group, {}, lease_s=cfg.replication_lease_s, on_lead=self._lead,
                               on_follow=self._follow, on_lost=self._lost, status=lambda: self.replica.status())

    def _replica(self, store: MessageStore, settings: ReplicaSettings) -> ReplicaNode:
        replica = ReplicaNode(store, settings, InSyncSet())
        replica.on_seeded = self._seeded
        return replica

    def _seeded(self) -> None:
        self._reseeding = asyncio.get_running_loop().create_task(self._open_seed(), name="replica-seed")

    async def _open_seed(self) -> None:
        """The leader's seed is complete: stop following, open the store again (which installs
        it) and follow from its end."""
        settings = self.replica.settings
        await self.replica.stop()
        store = await self._reopen()
        self.replica = self._replica(store, settings)
        await self.replica.follow(self.leader_address)
        log.info("store opened from the leader's seed and following again node=%s end=%d", self.group.node,
                 store.commitlog.end_position)

    async def start(self) -> None:
        # followers must be able to reach the leader's replication listener before it can win:
        # the address is known up front (the bind's port, or the advertised one)
        host, port = self._bind
        self.elector.info = {**self._advertised, "replication": self._advertise or f"{host}:{port}"}
        self.elector.start()

    async def stop(self) -> None:
        if self._reseeding is not None:
            await self._reseeding
        await self.elector.stop()
        if self.serving:
            await self._unserve()
            self.serving = False
        await self.replica.stop()
        await self.group.close()

    async def view(self) -> list[dict[str, Any]]:
        """The group as etcd holds it (``tidemq ctl cluster``)."""
        return await self.group.view()

    def leader_address(self) -> tuple[str, int] | None:
        info = self.elector.leader_info
        if info is None or info.get("node") == self.group.node:
            return None
        return parse_address(str(info.get("replication", "")))

    async def _lead(self, state: GroupState) -> None:
        self.replica.in_sync = EtcdInSyncSet(self.group, state.epoch, state.in_sync)
        host, port = self._bind
        await self.replica.lead(state.epoch, host, port)
        await self._serve()
        self.serving = True

    async def _follow(self, leader: dict[str, Any]) -> None:
        if self.replica.role != "follower":
            await self.replica.follow(self.leader_address)
        elif self.replica.follower is not None:
            self.replica.follower.relink()  # (a link to the old leader may still look alive: it is stopped)

    async def _lost(self) -> None:
        log.warning("leadership lost: clients are closed and the store follows the next leader node=%s",
                    self.group.node)
        if self.serving:
            self.serving = False
            try:
                await self._unserve()
            except Exception:
                log.exception("listeners did not stop cleanly")
        await self.replica.follow(self.leader_address)
        await asyncio.sleep(0)
