"""A rule delivers only while its node may act for it: a replicated group's leader whose lease
may have lapsed (a process resumed after a stop) delivers nothing more, even before its
election has noticed and stopped its rules. Through a real MQTT publisher and aiohttp webhook (a
rule whose node may not deliver, then may); the election's own fence (``Elector.leads_now``,
against a real etcd) is tested in test_election.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.rules_host import GatewayRuleHost, Rules

from .mqtt_support import PahoClient, mqtt_port, running_gateway
from .rules_support import Webhook, until


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
