"""A rule delivers only while its node may act for it: a replicated group's leader whose lease
may have lapsed (a process resumed after a stop) delivers nothing more, even before its
election has noticed and stopped its rules. Through a real etcd (the election) and a real MQTT
publisher and aiohttp webhook (a rule whose node may not deliver, then may)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gateway.cluster.election import Elector, EtcdGroup
from gateway.rules_host import GatewayRuleHost, Rules

from .etcd_support import etcd  # noqa: F401 (the fixture)
from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .rules_support import Webhook, until


async def test_a_leader_resumed_past_its_lease_does_not_lead_now_before_its_election_runs(etcd) -> None:
    lost = asyncio.Event()

    async def nothing(*_: object) -> None:
        pass

    async def on_lost() -> None:
        lost.set()

    group = EtcdGroup(("127.0.0.1", etcd.port), "fence", "n1")
    elector = Elector(group, {"replication": "127.0.0.1:1"}, lease_s=2.0, on_lead=nothing, on_follow=nothing,
                      on_lost=on_lost)
    elector.start()
    try:
        await until(lambda: elector.state is not None, what="the election")
        assert elector.leads_now()
        time.sleep(1.7)  # (the event loop stopped past 0.8 of the lease, as a SIGSTOP stops it)
        assert not elector.leads_now()  # (at once: the election's task has not run yet)
        assert not lost.is_set()
        await asyncio.wait_for(lost.wait(), 10)  # (then the election steps down)
        assert not elector.leads_now()
    finally:
        await elector.stop()
        await group.close()


async def test_a_rule_delivers_nothing_while_its_node_may_not_and_everything_when_it_may(tmp_path: Path) -> None:
    hook = Webhook()
    await hook.up()
    allowed = False
    async with running_gateway(tmp_path) as gw:
        assert gw.store is not None and gw.mqtt is not None
        host = GatewayRuleHost(gw.store, gw.mqtt.cache, gw.mqtt.wildcards, gw.mqtt.publish, lambda: allowed)
        rules = Rules(gw.store, host)
        rules.start({"fenced": {"sources": ["fence/#"], "targets": [{"type": "webhook", "url": hook.url}]}}, {})
        device = PahoClient(mqtt_port(gw), "fence-device")
        try:
            await device.connect()
            for n in range(5):
                await device.publish(f"fence/{n}", str(n), 1)
            await until(lambda: rules.engine.get("fenced")["matched"] >= 1,  # type: ignore[index]
                        what="an event read by the rule")
            await asyncio.sleep(0.5)
            assert hook.received == []
            allowed = True
            await hook.wait_for(5)
            assert [hit.body for hit in hook.received] == [b"0", b"1", b"2", b"3", b"4"]
        finally:
            await device.disconnect()
            await rules.stop()
            await hook.down()
