"""Event rules on a replicated store group: three real store node processes, a real etcd and a
gateway node, all on 127.0.0.1. A rule runs on the group's leader only; a follower promoted by
``kill -9`` of the leader resumes it from the offset the group holds (at least once, in order
per source queue), and a leader that lost its lease while stopped (SIGSTOP, then SIGCONT) stops
its rules. MQTT devices and CloudEvents publishers use the gateway node; its admin API names
the leader for the rules."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import aio_pika
from cloudevents.core.bindings.http import to_binary, to_structured
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from .crash_support import free_port, kill9, launch, stop
from .etcd_support import etcd  # noqa: F401 (the fixture)
from .mqtt_support import PahoClient
from .rules_support import Webhook, call, until
from .test_cloudevents_ingest import CREATED, batch, order, post
from .test_replication_processes import (
    GROUP,
    connect,
    publish_until_acknowledged,
    start_group,
    wait_in_sync,
    wait_leader,
)

RULE = {"name": "lines", "sources": ["line/#"], "pattern": {"data": [{"numeric": [">=", 0]}]},
        "retry": {"initial_backoff_ms": 20, "max_backoff_ms": 200}}


def start_gateway_node(tmp_path: Path, etcd_endpoint: str, amqp_port: int = 0) -> tuple[int, str, object]:
    """A gateway node with MQTT (and AMQP on ``amqp_port``) and its HTTP listener: (MQTT port,
    HTTP base address, process)."""
    mqtt_port, metrics = free_port(), free_port()
    proc = launch(["--role", "gateway", "--node-id", "gw1", "--replication-group", GROUP, "--etcd", etcd_endpoint,
                   "--mqtt-bind", f"127.0.0.1:{mqtt_port}", "--metrics-bind", f"127.0.0.1:{metrics}",
                   "--amqp-bind", f"127.0.0.1:{amqp_port}" if amqp_port else "",
                   "--data-dir", str(tmp_path / "gw1")], name="gw1")
    return mqtt_port, f"http://127.0.0.1:{metrics}", proc


def serves_http(port: int) -> bool:
    """Whether a node's HTTP listener (admin API, metrics) is open: a store node opens it only
    while it leads."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def numbers(hook: Webhook) -> list[int]:
    return [int(hit.body) for hit in hook.received]


def first_times(values: list[int]) -> list[int]:
    """``values`` with every repeat of an earlier value left out."""
    seen: set[int] = set()
    return [v for v in values if not (v in seen or seen.add(v))]  # type: ignore[func-returns-value]


async def create_rule(base: str, url: str) -> None:
    deadline = time.monotonic() + 20
    while True:  # (the definition is a meta write: refused until a follower is in sync)
        status, body = await call(base, "POST", "/admin/rules",
                                  {**RULE, "targets": [{"type": "webhook", "url": url, "timeout_s": 2}]})
        if status == 201:
            return
        assert time.monotonic() < deadline, f"the rule was not created: {status} {body}"
        await asyncio.sleep(0.2)


async def test_a_rule_runs_on_the_leader_only_and_a_promoted_follower_resumes_it_after_kill9(
        tmp_path: Path, etcd) -> None:
    """Events published through the gateway node before and after kill -9 of the leader: every
    one reaches the webhook (repeats allowed: those delivered after the last offset the group
    holds), first seen in the order published; the rule then runs on the new leader alone (the
    followers serve no HTTP and started no rule)."""
    hook = Webhook()
    await hook.up()
    nodes = start_group(tmp_path, etcd.endpoint)
    mqtt_port, gateway_base, gateway = start_gateway_node(tmp_path, etcd.endpoint)
    try:
        leader = await wait_leader(etcd)
        await wait_in_sync(etcd, set(nodes) - {leader["node"]})
        first = nodes[leader["node"]]
        await create_rule(f"http://127.0.0.1:{first.metrics_port}", hook.url)
        await publish_until_acknowledged(mqtt_port, "meter", list(range(50)))
        await until(lambda: set(numbers(hook)) >= set(range(50)), what="the events before the kill")
        kill9(first.proc)
        await publish_until_acknowledged(mqtt_port, "meter", list(range(50, 100)))
        successor = await wait_leader(etcd, not_node=first.name)
        await until(lambda: set(numbers(hook)) >= set(range(100)), timeout_s=30, what="every event")
        await asyncio.sleep(0.5)  # (nothing more comes)
        got = numbers(hook)
        print(f"rule on a replicated group: {len(got)} deliveries of 100 events, {len(got) - 100} repeats")
        assert first_times(got) == list(range(100))
        second = nodes[successor["node"]]
        status, row = await call(f"http://127.0.0.1:{second.metrics_port}", "GET", "/admin/rules/lines")
        assert status == 200 and row["state"] == "running", row
        followers = [node for node in nodes.values() if node.name not in (first.name, second.name)]
        for node in followers:
            assert not serves_http(node.metrics_port)
            assert "rules started" not in (tmp_path / f"{node.name}.log").read_text()
        assert 'msg="rules started" count=1' in (tmp_path / f"{second.name}.log").read_text()
    finally:
        stop(gateway)
        for node in nodes.values():
            stop(node.proc)
        await hook.down()


async def test_a_leader_stopped_past_its_lease_stops_its_rules_when_it_runs_again(tmp_path: Path, etcd) -> None:
    """A rule declared in the store nodes' configuration, run by the leader. SIGSTOP of the
    leader: another node leads and runs the rule; SIGCONT: the old leader finds its lease lost,
    steps down and stops its rules (its HTTP listener closes), and events published afterwards
    reach the webhook from the new leader, none lost."""
    hook = Webhook()
    await hook.up()
    declared = {"lines": {**{k: v for k, v in RULE.items() if k != "name"},
                          "targets": [{"type": "webhook", "url": hook.url, "timeout_s": 2}]}}
    nodes = start_group(tmp_path, etcd.endpoint, env={"TIDEMQ_EVENT_RULES": json.dumps(declared)})
    mqtt_port, _, gateway = start_gateway_node(tmp_path, etcd.endpoint)
    try:
        leader = await wait_leader(etcd)
        await wait_in_sync(etcd, set(nodes) - {leader["node"]})
        first = nodes[leader["node"]]
        status, row = await call(f"http://127.0.0.1:{first.metrics_port}", "GET", "/admin/rules/lines")
        assert status == 200 and row["state"] == "running", row
        await publish_until_acknowledged(mqtt_port, "meter", list(range(20)))
        await until(lambda: set(numbers(hook)) >= set(range(20)), what="the events before the stop")
        os.kill(first.proc.pid, signal.SIGSTOP)
        try:
            await wait_leader(etcd, not_node=first.name)
            await publish_until_acknowledged(mqtt_port, "meter", list(range(20, 40)))
        finally:
            os.kill(first.proc.pid, signal.SIGCONT)
        await until(lambda: not serves_http(first.metrics_port), what="the old leader to stop serving")
        await publish_until_acknowledged(mqtt_port, "meter", list(range(40, 60)))
        await until(lambda: set(numbers(hook)) >= set(range(60)), timeout_s=30, what="every event")
        assert first_times(numbers(hook)) == list(range(60))
        assert "leadership lost" in (tmp_path / f"{first.name}.log").read_text()
    finally:
        stop(gateway)
        for node in nodes.values():
            stop(node.proc)
        await hook.down()


async def test_a_gateway_node_names_the_leader_for_rules_and_takes_cloudevents_through_its_store_link(
        tmp_path: Path, etcd) -> None:
    """The gateway node's admin API answers requests for rules and schemas with 421 and the
    leader's address; its CloudEvents endpoint checks each event against the schemas the leader
    keeps (one put there is checked at once) and stores the events through its store link, where
    the leader's rules read them, as they read an AMQP client's publish to ``amq.topic`` relayed
    by the gateway node: a webhook gets each, and a topic target's copies (put on the store
    node) reach an MQTT subscriber of the gateway node."""
    hook = Webhook()
    await hook.up()
    nodes = start_group(tmp_path, etcd.endpoint)
    amqp_port = free_port()
    mqtt_port, gateway_base, gateway = start_gateway_node(tmp_path, etcd.endpoint, amqp_port)
    try:
        leader = await wait_leader(etcd)
        await wait_in_sync(etcd, set(nodes) - {leader["node"]})
        leader_base = f"http://127.0.0.1:{nodes[leader['node']].metrics_port}"
        deadline = time.monotonic() + 20
        while (status := (await call(leader_base, "POST", "/admin/rules", {
                "name": "created", "sources": ["orders/#"], "pattern": {"type": [CREATED]},
                "targets": [{"type": "webhook", "url": hook.url}]}))[0]) != 201:
            assert time.monotonic() < deadline, status
            await asyncio.sleep(0.2)
        # a topic target: republished on the store node, seen by a subscriber of the gateway node
        status, row = await call(leader_base, "POST", "/admin/rules", {
            "name": "copy", "sources": ["orders/#"], "targets": [{"type": "topic", "topic": "copies/orders"}]})
        assert status == 201, row
        watcher = PahoClient(mqtt_port, "watcher")
        await watcher.connect()
        await watcher.subscribe("copies/#", 1)
        for path in ("/admin/rules", "/admin/rules/created", "/admin/schemas"):
            status, body = await call(gateway_base, "GET", path)
            assert status == 421 and leader_base in json.dumps(body), (path, status, body)
        status, _ = await call(leader_base, "PUT", f"/admin/schemas/{CREATED}",
                               {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}})
        assert status == 201
        misfit = to_structured(CloudEvent(attributes={"type": CREATED, "source": "/shop"}, data={"total": 1}),
                               JSONFormat())
        status, answer = await post(gateway_base, "orders/berlin", misfit.body, misfit.headers)
        assert status == 400 and "does not fit its schema" in answer["error"], answer
        binary = to_binary(order(1), JSONFormat())
        status, answer = await post(gateway_base, "orders/berlin", binary.body, binary.headers)
        assert status == 200 and answer["stored"] == 1, answer
        status, answer = await post(gateway_base, "orders/paris", batch(order(2), order(3)),
                                    {"Content-Type": "application/cloudevents-batch+json"})
        assert status == 200 and answer["stored"] == 2, answer
        connection = await connect(amqp_port)
        channel = await connection.channel()  # (publisher confirms: stored when it returns)
        exchange = await channel.get_exchange("amq.topic")
        await exchange.publish(aio_pika.Message(json.dumps({"n": 4}).encode(), type=CREATED,
                                                content_type="application/json"), routing_key="orders.amqp")
        await connection.close()
        hits = await hook.wait_for(4)
        assert [hit.json()["n"] for hit in hits] == [1, 2, 3, 4]
        assert [hit.headers["ce-type"] for hit in hits] == [CREATED] * 4
        assert hits[3].headers["ce-subject"] == "orders/amqp"
        copies = await watcher.receive(4)
        assert [json.loads(m.payload)["n"] for m in copies] == [1, 2, 3, 4]
        assert {m.topic for m in copies} == {"copies/orders"}
        await watcher.disconnect()
    finally:
        stop(gateway)
        for node in nodes.values():
            stop(node.proc)
        await hook.down()
