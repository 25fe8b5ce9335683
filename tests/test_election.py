"""The store group's election against a real etcd: the lease is renewed while the node does what
winning asks of it, however long that takes; a node whose lease may have lapsed does not say it
leads, before its election has noticed (the fence of what acts outside the store: rules)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from gateway.cluster.election import Elector, EtcdGroup

from .etcd_support import etcd  # noqa: F401 (the fixture)
from .rules_support import until


async def _nothing(*_: object) -> None:
    pass


def elector(group: EtcdGroup, on_lead: Callable[[object], Awaitable[None]] = _nothing
            ) -> tuple[Elector, asyncio.Event]:
    """An elector with a 2 s lease for ``group``, started, and the event its loss of the lead sets."""
    lost = asyncio.Event()

    async def on_lost() -> None:
        lost.set()

    made = Elector(group, {"replication": "127.0.0.1:1"}, lease_s=2.0, on_lead=on_lead, on_follow=_nothing,
                   on_lost=on_lost)
    made.start()
    return made, lost


async def test_a_leader_resumed_past_its_lease_does_not_lead_now_before_its_election_runs(etcd) -> None:
    group = EtcdGroup(("127.0.0.1", etcd.port), "fence", "n1")
    running, lost = elector(group)
    try:
        await until(lambda: running.state is not None, what="the election")
        assert running.leads_now()
        time.sleep(1.7)  # (the event loop stopped past 0.8 of the lease, as a SIGSTOP stops it)
        assert not running.leads_now()  # (at once: the election's task has not run yet)
        assert not lost.is_set()
        await asyncio.wait_for(lost.wait(), 10)  # (then the election steps down)
        assert not running.leads_now()
    finally:
        await running.stop()
        await group.close()


async def test_a_leader_whose_start_outlasts_its_lease_keeps_leading(etcd) -> None:
    """Starting to serve (the listeners, the brokers' state) may take longer than the lease on a
    loaded machine: the renewal goes on meanwhile, so the node still leads afterwards and is not
    deposed the moment it is ready."""
    started = asyncio.Event()

    async def slow_start(_state: object) -> None:
        await asyncio.sleep(3.0)  # (1.5 leases)
        started.set()

    group = EtcdGroup(("127.0.0.1", etcd.port), "slow", "n1")
    running, lost = elector(group, slow_start)
    try:
        await asyncio.wait_for(started.wait(), 15)
        assert running.leads_now()
        await asyncio.sleep(1.0)  # (the election's loop runs again after the start)
        assert not lost.is_set(), "the leader was deposed by its own slow start"
        assert running.state is not None
        leader = await group.leader()
        assert leader is not None and leader["node"] == "n1"
    finally:
        await running.stop()
        await group.close()


async def test_a_leader_whose_lease_runs_out_during_its_start_steps_down_after_it(etcd) -> None:
    """The renewal fails while the node is still starting (etcd stopped): once the start is done,
    it steps down, and it never said it led in the meantime once the lease may have lapsed."""
    stalled = asyncio.Event()
    said_it_led: list[bool] = []

    async def slow_start(_state: object) -> None:
        etcd.stop()
        await asyncio.sleep(2.5)
        said_it_led.append(running.leads_now())
        stalled.set()

    group = EtcdGroup(("127.0.0.1", etcd.port), "lapse", "n1")
    running, lost = elector(group, slow_start)
    try:
        await until(lambda: stalled.is_set(), what="the slow start")
        await asyncio.wait_for(lost.wait(), 10)
        assert running.state is None
        assert said_it_led == [False], "it said it led after its lease may have lapsed"
    finally:
        await running.stop()
        await group.close()
