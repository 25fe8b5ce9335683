"""One store's place in a replicated group: the leader (takes writes, streams its log, holds
their acknowledgement until confirmed in ``sync`` mode) or a follower (takes the leader's bytes,
refuses writes). Whoever decides leadership (gateway/cluster/, with etcd) calls ``lead`` and
``follow``; this class only carries them out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import NotLeaderError, NotReplicatedError
from ..write.replicated import ReplicatedRelease
from . import roles
from .link import FollowerService, InSyncSet, LeaderService
from .seed import snapshot

if TYPE_CHECKING:
    from ..store import MessageStore

log = logging.getLogger("tidemq.store.replica")

ReplicationMode = Literal["sync", "async"]


@dataclass(slots=True)
class ReplicaSettings:
    node: str
    mode: ReplicationMode = "sync"
    min_insync: int = 2  # replicas, the leader among them, that hold a write before it is acknowledged
    lag_s: float = 2.0  # a follower behind this long leaves the in-sync set
    timeout_s: float = 5.0  # a write not confirmed within this is answered NotReplicatedError
    token: str = ""  # a follower must present it


class ReplicaNode:
    def __init__(self, store: MessageStore, settings: ReplicaSettings, in_sync: InSyncSet) -> None:
        self.store = store
        self.settings = settings
        self.in_sync = in_sync
        self.role: Literal["leader", "follower", "none"] = "none"
        self.leader: LeaderService | None = None
        self.follower: FollowerService | None = None
        self._watch: asyncio.Task[None] | None = None
        # a follower received a seed (replica/seed.py): its owner closes the store and opens it
        # again, which installs the seed, then follows with a new ReplicaNode
        self.on_seeded: Callable[[], None] | None = None
        assert store.committer is not None
        store.committer.not_leader = NotLeaderError("the group has not chosen this store as its leader")

    @property
    def epoch(self) -> int:
        return self.store.epochs.current

    async def lead(self, epoch: int, host: str, port: int) -> int:
        """Become the leader of ``epoch`` and serve followers on (host, port); the port bound."""
        await self._stop_role()
        store, settings = self.store, self.settings
        committer = store.committer
        assert committer is not None
        sync = settings.mode == "sync"
        flush_sync = store.options.flush == "sync"
        commitlog = store.commitlog

        def own_position() -> int:
            return commitlog.flushed_position if flush_sync else commitlog.end_position

        release = ReplicatedRelease(committer.release, settings.timeout_s) if sync else None
        committer.replicated = release  # (before the store leads: its unpublished tail waits for confirmation)
        leader_log = roles.lead(store, epoch, settings.token)
        service = LeaderService(leader_log, commitlog, self.in_sync, min_insync=settings.min_insync if sync else 1,
                                own_position=own_position, durable_acks=flush_sync, lag_s=settings.lag_s,
                                on_confirmed=release.confirm if release is not None else None,
                                on_in_sync=self._in_sync_changed if sync else None,
                                snapshot=lambda: snapshot(store.options.data_dir, store.index.db, store.meta.db,
                                                          commitlog))
        committer.on_write = service.written
        bound = await service.start(host, port)
        self.leader, self.role = service, "leader"
        if release is not None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_in_sync(service, release))
        log.info("store leads epoch=%d mode=%s min_insync=%d port=%d", epoch, settings.mode, settings.min_insync, bound)
        return bound

    async def follow(self, address: Callable[[], tuple[str, int] | None]) -> None:
        """Follow the leader at ``address()`` (asked again at each reconnect)."""
        await self._stop_role()
        store = self.store
        service = FollowerService(roles.follow(store), store.commitlog, self.settings.node, address,
                                  token=self.settings.token, flush=store.options.flush == "sync",
                                  data_dir=store.options.data_dir, on_seeded=self.on_seeded)
        service.start()
        self.follower, self.role = service, "follower"
        log.info("store follows node=%s", self.settings.node)

    async def stop(self) -> None:
        await self._stop_role()
        self.role = "none"

    async def _stop_role(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        committer = self.store.committer
        if self.leader is not None:
            assert committer is not None
            committer.not_leader = NotLeaderError("this store no longer leads its group")
            if committer.replicated is not None:
                committer.replicated.abandon(committer.not_leader)
                committer.forget_unpublished()
            committer.replicated = None
            committer.on_write = None
            committer.unavailable = None
            await self.leader.stop()
            self.leader = None
        if self.follower is not None:
            await self.follower.stop()
            self.follower = None

    async def _watch_in_sync(self, service: LeaderService, release: ReplicatedRelease) -> None:
        """Answer the writes waiting too long."""
        while True:
            release.expire()
            await asyncio.sleep(0.05)

    def _in_sync_changed(self, members: frozenset[str]) -> None:
        """Refuse writes while fewer than ``min_insync`` replicas are in sync."""
        committer = self.store.committer
        assert committer is not None
        replicas = 1 + len(members)
        if replicas < self.settings.min_insync:
            if committer.unavailable is None:
                log.warning("writes refused: too few replicas in sync in_sync=%d min_insync=%d",
                            replicas, self.settings.min_insync)
            committer.unavailable = NotReplicatedError(
                f"{replicas} of the {self.settings.min_insync} replicas needed are in sync")
        elif committer.unavailable is not None:
            committer.unavailable = None
            log.info("writes taken again: replicas in sync in_sync=%d", replicas)

    def status(self) -> dict[str, object]:
        """Role, epoch, confirmed position and each follower's lag in bytes (for ctl and metrics)."""
        out: dict[str, object] = {"node": self.settings.node, "role": self.role, "epoch": self.epoch,
                                  "end": self.store.commitlog.end_position}
        if self.leader is not None:
            end = self.store.commitlog.end_position
            out["confirmed"] = self.leader.confirmed
            out["in_sync"] = sorted(self.in_sync.members)
            now = time.monotonic()
            out["followers"] = {n: {"position": f.position, "lag_bytes": max(0, end - f.position),
                                    "lag_s": round(now - f.behind_since, 3) if f.behind_since is not None else 0.0,
                                    "connected": f.connected}
                                for n, f in self.leader.followers.items()}
        if self.follower is not None:
            out["confirmed"] = self.follower.follower.confirmed
            out["connected"] = self.follower.connected.is_set()
        return out
