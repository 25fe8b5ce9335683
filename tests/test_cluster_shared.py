"""Shared subscriptions (``$share/{group}/{filter}``) in a cluster. Each gateway node would run
its own copy of a group over the one committed offset in the store node, so a group with
members on two nodes would get every message once per node, where MQTT 5.0 section 4.8.2 says
once per group. Until a group has one owner in the cluster, gateway nodes refuse them: SUBACK
0x9E (5.0) or 0x80 (3.1.1), CONNACK's Shared Subscription Available = 0, counted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from protocols.mqtt.packets import MQTT_5

from .mqtt_support import PahoClient, mqtt_port
from .test_cluster_mqtt import cluster
from .test_metrics import fetch, samples, value

REFUSED = "tidemq_mqtt_shared_subscriptions_refused_total"


async def test_a_shared_group_across_gateway_nodes_is_refused_not_run_once_per_node(data_dir: Path) -> None:
    async with cluster(data_dir) as (_, (a, b)):
        on_a = PahoClient(mqtt_port(a), "worker-a", version=MQTT_5)
        _, _, props = await on_a.connect()
        assert props.SharedSubscriptionAvailable == 0  # said before the client tries
        on_b = PahoClient(mqtt_port(b), "worker-b")  # 3.1.1: no property, no 0x9E; 0x80
        await on_b.connect()
        granted_a = await on_a.subscribe("$share/crew/jobs", qos=1)
        granted_b = await on_b.subscribe("$share/crew/jobs", qos=1)
        assert [int(code.value) for code in granted_a] == [0x9E]  # Shared Subscriptions not supported
        assert [int(code.value) for code in granted_b] == [0x80]
        publisher = PahoClient(mqtt_port(a), "ops")
        await publisher.connect()
        for i in range(10):
            await publisher.publish("jobs", f"job-{i}", 1)
        await on_a.nothing_more()  # (before: 10 on each node, each message twice in one group)
        await on_b.nothing_more()
        assert await on_a.subscribe("jobs", qos=1) is not None  # a plain subscription is served
        await publisher.publish("jobs", "plain", 1)
        assert [m.payload for m in await on_a.receive(1)] == [b"plain"]
        for node in (a, b):
            _, text = await fetch("http://{}:{}".format(*node.metrics_address), "/metrics")
            assert value(samples(text), REFUSED, cause="subscribe") == 1
        for client in (on_a, on_b, publisher):
            await client.disconnect()


async def test_a_session_resumed_on_a_gateway_node_loses_its_shared_subscription(data_dir: Path) -> None:
    """A persistent session stored with a shared subscription (by an earlier version, which ran
    groups on gateway nodes) resumes without it: counted, taken out of the stored session; its
    other subscriptions carry on."""
    async with cluster(data_dir) as (store, (a, b)):
        publisher = PahoClient(mqtt_port(a), "ops")
        await publisher.connect()
        device = PahoClient(mqtt_port(a), "dev-1", clean=False)
        await device.connect()
        await device.subscribe("cmd/dev-1", 1)
        await publisher.publish("cmd/dev-1", "hello", 1)
        assert [m.payload for m in await device.receive(1)] == [b"hello"]
        await device.disconnect()
        await asyncio.sleep(0.3)  # (node a writes the session back)
        sessions = store.store.table("mqtt.sessions")
        doc = json.loads(sessions.get("dev-1") or b"")
        doc["subs"].append(["jobs", 1, False, False, 0, "crew", None, "t:jobs"])
        sessions.put("dev-1", json.dumps(doc).encode())
        back = PahoClient(mqtt_port(b), "dev-1", clean=False)
        flags, _, _ = await back.connect()
        assert flags.session_present
        await publisher.publish("jobs", "job-1", 1)
        await publisher.publish("cmd/dev-1", "reboot", 1)
        assert [m.payload for m in await back.receive(1)] == [b"reboot"]
        await back.nothing_more()
        _, text = await fetch("http://{}:{}".format(*b.metrics_address), "/metrics")
        assert value(samples(text), REFUSED, cause="resumed") == 1
        await back.disconnect()
        await asyncio.sleep(0.3)  # (node b writes the session back)
        assert [sub[0] for sub in json.loads(sessions.get("dev-1") or b"")["subs"]] == ["cmd/dev-1"]
        await publisher.disconnect()
