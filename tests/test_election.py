"""The store group's election against a real etcd: the lease is renewed while the node does what
winning asks of it, however long that takes."""

from __future__ import annotations

import asyncio

from gateway.cluster.election import Elector, EtcdGroup

from .etcd_support import etcd  # noqa: F401 (the fixture)
from .rules_support import until


async def test_a_leader_whose_start_outlasts_its_lease_keeps_leading(etcd) -> None:
    """Starting to serve (the listeners, the brokers' state) may take longer than the lease on a
    loaded machine: the renewal goes on meanwhile, so the node still leads afterwards and is not
    deposed the moment it is ready."""
    lost = asyncio.Event()
    started = asyncio.Event()

    async def slow_start(_state: object) -> None:
        await asyncio.sleep(3.0)  # (1.5 leases)
        started.set()

    async def nothing(*_: object) -> None:
        pass

    async def on_lost() -> None:
        lost.set()

    group = EtcdGroup(("127.0.0.1", etcd.port), "slow", "n1")
    elector = Elector(group, {"replication": "127.0.0.1:1"}, lease_s=2.0, on_lead=slow_start, on_follow=nothing,
                      on_lost=on_lost)
    elector.start()
    try:
        await asyncio.wait_for(started.wait(), 15)
        assert elector.leads_now()
        await asyncio.sleep(1.0)  # (the election's loop runs again after the start)
        assert not lost.is_set(), "the leader was deposed by its own slow start"
        assert elector.state is not None
        leader = await group.leader()
        assert leader is not None and leader["node"] == "n1"
    finally:
        await elector.stop()
        await group.close()


async def test_a_leader_whose_lease_runs_out_during_its_start_steps_down_after_it(etcd) -> None:
    """The renewal fails while the node is still starting (etcd stopped): once the start is done,
    it steps down, and it never said it led in the meantime once the lease may have lapsed."""
    lost = asyncio.Event()
    started = asyncio.Event()
    stalled = asyncio.Event()
    said_it_led: list[bool] = []

    async def slow_start(_state: object) -> None:
        etcd.stop()
        await asyncio.sleep(2.5)
        said_it_led.append(elector.leads_now())
        stalled.set()
        started.set()

    async def nothing(*_: object) -> None:
        pass

    async def on_lost() -> None:
        lost.set()

    group = EtcdGroup(("127.0.0.1", etcd.port), "lapse", "n1")
    elector = Elector(group, {"replication": "127.0.0.1:1"}, lease_s=2.0, on_lead=slow_start, on_follow=nothing,
                      on_lost=on_lost)
    elector.start()
    try:
        await until(lambda: stalled.is_set(), what="the slow start")
        await asyncio.wait_for(lost.wait(), 10)
        assert started.is_set() and elector.state is None
        assert said_it_led == [False], "it said it led after its lease may have lapsed"
    finally:
        await elector.stop()
        await group.close()
