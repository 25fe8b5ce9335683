"""Every path that hands stored messages to a principal passes the ACL's read check on each
message's topic, through real clients: retained messages on subscribe (MQTT 3.1.1 and 5.0, plain
and wildcard filters), live and shared deliveries, a persistent session's queued and unacknowledged
messages after the ACL changed, and the data API's listings and reads."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.auth import PasswordFile
from protocols.mqtt.packets import MQTT_3_1_1, MQTT_5, Connect, PacketType, Properties, Subscribe, Subscription

from .mqtt_support import PahoClient, RawClient, mqtt_port, running_gateway

ACL = """
user admin
topic readwrite #
amqp ".*" ".*" ".*"

user eve
topic readwrite #
topic deny secret/#
"""

# the same users after an operator narrowed eve's rights (no deny rule: a resumed session's
# subscription to "#" is no longer covered, so each of its messages is checked)
NARROWED_ACL = """
user admin
topic readwrite #
amqp ".*" ".*" ".*"

user eve
topic read public/#
"""


@pytest.fixture
def secured(tmp_path: Path) -> dict:
    users = PasswordFile()
    for name in ("admin", "eve"):
        users.set(name, "pw-" + name, iterations=1000)
    users.save(tmp_path / "passwd")
    (tmp_path / "acl").write_text(ACL)
    return {"password_file": str(tmp_path / "passwd"), "acl_file": str(tmp_path / "acl"), "allow_anonymous": False}


async def publish_as_admin(gw, *messages: tuple[str, bytes], retain: bool = False) -> None:
    admin = PahoClient(mqtt_port(gw), "admin-pub", username="admin", password="pw-admin")
    await admin.connect()
    for topic, payload in messages:
        await admin.publish(topic, payload, 1, retain=retain)
    await admin.disconnect()


@pytest.mark.parametrize("version", [MQTT_3_1_1, MQTT_5])
@pytest.mark.parametrize("topic_filter", ["#", "+/r", "public/r"])
async def test_retained_messages_pass_the_read_check(data_dir: Path, secured: dict, version: int,
                                                     topic_filter: str) -> None:
    async with running_gateway(data_dir, **secured) as gw:
        await publish_as_admin(gw, ("secret/r", b"hidden"), ("public/r", b"open"), retain=True)
        eve = PahoClient(mqtt_port(gw), "eve-sub", version=version, username="eve", password="pw-eve")
        await eve.connect()
        await eve.subscribe(topic_filter, 1)
        got = await eve.receive(1)
        assert [(m.topic, m.payload, m.retain) for m in got] == [("public/r", b"open", True)]
        await publish_as_admin(gw, ("secret/r", b"live"), ("public/r", b"live"))  # live: checked as before
        got = await eve.receive(1)
        assert [(m.topic, m.payload) for m in got] == [("public/r", b"live")]
        await eve.nothing_more()
        await eve.disconnect()


async def test_retained_messages_on_a_gateway_node_pass_the_read_check(data_dir: Path, secured: dict) -> None:
    """In a cluster the retained index is the store node's; the gateway node checks what it sends."""
    from .test_cluster_mqtt import cluster

    async with cluster(data_dir, **secured) as (_, (a, b)):
        await publish_as_admin(a, ("secret/r", b"hidden"), ("public/r", b"open"), retain=True)
        eve = PahoClient(mqtt_port(b), "eve-sub", version=MQTT_5, username="eve", password="pw-eve")
        await eve.connect()
        await eve.subscribe("#", 1)
        assert [(m.topic, m.payload) for m in await eve.receive(1)] == [("public/r", b"open")]
        await eve.nothing_more()
        await eve.disconnect()


async def test_retained_messages_of_a_plain_filter_denied_are_not_sent(data_dir: Path, secured: dict) -> None:
    """A filter the deny rule covers is refused outright (SUBACK 0x87): no retained message either."""
    async with running_gateway(data_dir, **secured) as gw:
        await publish_as_admin(gw, ("secret/r", b"hidden"), retain=True)
        eve = PahoClient(mqtt_port(gw), "eve-sub", version=MQTT_5, username="eve", password="pw-eve")
        await eve.connect()
        codes = await eve.subscribe("secret/r", 1)
        assert [int(c.value) for c in codes] == [0x87]
        await eve.nothing_more()
        await eve.disconnect()


async def test_resumed_session_after_the_acl_narrowed_gets_only_what_it_may_read(
        data_dir: Path, secured: dict, tmp_path: Path) -> None:
    """A persistent session subscribed to ``#`` under the old ACL: after a restart with an ACL that
    lets eve read ``public/#`` only, neither its queued messages nor its unacknowledged one of a
    topic it may no longer read are sent (the latter is settled); the readable one is."""
    connect = Connect("eve-persistent", MQTT_5, clean_start=False, username="eve", password=b"pw-eve",
                      properties=Properties(session_expiry_interval=600))
    (tmp_path / "acl").write_text(ACL.replace("topic deny secret/#\n", ""))
    async with running_gateway(data_dir, **secured) as gw:  # eve may read everything
        eve, ack = await RawClient.connected(mqtt_port(gw), connect)
        assert ack.reason_code == 0
        eve.send(Subscribe(1, [Subscription("#", 1)]))
        assert (await eve.recv()).reason_codes == [1]
        await publish_as_admin(gw, ("secret/x", b"sent, not acknowledged"))
        sent = await eve.recv()
        assert (sent.topic, sent.qos) == ("secret/x", 1)
        await eve.close()  # no PUBACK
        await asyncio.sleep(0.2)
        await publish_as_admin(gw, ("secret/y", b"queued"), ("public/y", b"queued"))
    (tmp_path / "acl").write_text(NARROWED_ACL)
    async with running_gateway(data_dir, **secured) as gw:
        eve, ack = await RawClient.connected(mqtt_port(gw), connect)
        assert ack.reason_code == 0 and ack.session_present
        got = await eve.recv()
        assert (got.packet_type, got.topic, got.payload) == (PacketType.PUBLISH, "public/y", b"queued")
        with pytest.raises(asyncio.TimeoutError):
            extra = await eve.recv(timeout=0.5)
            raise AssertionError(f"unexpected {extra}")
        await eve.close()


def publish_over_amqp(gw, *routing_keys: str) -> None:
    import pika

    port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("admin", "pw-admin")))
    channel = conn.channel()
    channel.confirm_delivery()
    for key in routing_keys:
        channel.basic_publish("amq.topic", key, b"amqp")
    conn.close()


async def test_every_mqtt_delivery_path_passes_the_read_check(data_dir: Path, secured: dict) -> None:
    """Plain and shared subscriptions of eve to everything get, of what admin stores on secret/
    and public/ -- published over MQTT or AMQP, retained, a will, a delayed publish --, the public
    half only."""
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0", **secured) as gw:
        await publish_as_admin(gw, ("secret/r", b"retained"), ("public/r", b"retained"), retain=True)
        plain = PahoClient(mqtt_port(gw), "eve-plain", version=MQTT_5, username="eve", password="pw-eve")
        shared = PahoClient(mqtt_port(gw), "eve-shared", version=MQTT_5, username="eve", password="pw-eve")
        for client, topic_filter in ((plain, "#"), (shared, "$share/g/#")):
            await client.connect()
            await client.subscribe(topic_filter, 1)
        expected = [("public/r", b"retained")]
        assert [(m.topic, m.payload) for m in await plain.receive(1)] == expected  # (none for a shared one)
        await publish_as_admin(gw, ("secret/p", b"published"), ("public/p", b"published"),
                               ("$delayed/0/secret/d", b"delayed"), ("$delayed/0/public/d", b"delayed"))
        await asyncio.to_thread(publish_over_amqp, gw, "secret.a", "public.a")
        for topic in ("secret/will", "public/will"):
            dying = PahoClient(mqtt_port(gw), f"admin-{topic}", username="admin", password="pw-admin",
                               will=(topic, b"will", 1))
            await dying.connect()
            dying.drop()
        expected = {("public/p", b"published"), ("public/d", b"delayed"), ("public/a", b"amqp"),
                    ("public/will", b"will")}
        for client in (plain, shared):
            assert {(m.topic, m.payload) for m in await client.receive(4)} == expected
            await client.nothing_more()
            await client.disconnect()


# -- the data API (the Spark source's reads) ----------------------------------------------------
async def test_data_api_reads_pass_the_read_check(data_dir: Path, secured: dict) -> None:
    """Every /data/ endpoint that lists or reads stored messages: eve sees public/ only."""
    from bridge.data_client import HttpClient, SourceError

    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", **secured) as gw:
        await publish_as_admin(gw, ("secret/r", b"hidden"), ("public/r", b"open"), retain=True)
        eve = HttpClient(f"http://127.0.0.1:{gw.metrics_address[1]}", username="eve", password="pw-eve")

        def run() -> None:
            assert eve.topic_queues(["#", "+/r"]) == {"t:public/r": (0, 1)}
            listed = eve._json("GET", "/data/queues?prefix=t:")
            assert [row["queue"] for row in listed["queues"]] == ["t:public/r"] and listed["next_after"] is None
            assert eve._json("GET", "/data/queues?topicFilter=%23")["queues"] == []  # w:# holds secret/ too
            for queue in ("t:secret/r", "w:#", "w:+/r"):
                with pytest.raises(SourceError, match="403"):
                    eve.read(queue, 0, 10, 10)
                with pytest.raises(SourceError, match="403"):
                    eve.offsets([queue])
                with pytest.raises(SourceError, match="403"):
                    eve.offsets_for_times({queue: 0})
            assert [b.num_rows for b in eve.read("t:public/r", 0, 10, 10).batches] == [1]

        await asyncio.to_thread(run)


async def test_a_listing_of_presence_topics_without_the_right_to_read_them_all_is_refused(
        data_dir: Path, tmp_path: Path, secured: dict) -> None:
    """The presence events are stored only in their held filter's queue: a principal that may read
    some of their topics but not the whole filter is told so, not given an empty listing."""
    from bridge.data_client import HttpClient, SourceError

    (tmp_path / "acl").write_text(ACL.replace("user admin\n", "user admin\ntopic read $SYS/#\n")
                                  + "topic read $SYS/brokers/+/clients/+/disconnected\n")
    async with running_gateway(data_dir, metrics_bind="127.0.0.1:0", **secured) as gw:
        url = f"http://127.0.0.1:{gw.metrics_address[1]}"
        eve = HttpClient(url, username="eve", password="pw-eve")
        admin = HttpClient(url, username="admin", password="pw-admin")
        device = PahoClient(mqtt_port(gw), "device", username="admin", password="pw-admin")
        await device.connect()
        await device.disconnect()

        def run() -> None:
            with pytest.raises(SourceError, match="403.*presence events.*whole filter"):
                eve.topic_queues(["$SYS/brokers/+/clients/+/disconnected"])
            assert eve.topic_queues(["public/#"]) == {}  # (other filters: listed as before)
            listed = admin.topic_queues(["$SYS/brokers/+/clients/+/disconnected"])
            assert list(listed) == ["w:$SYS/brokers/+/clients/+/+"] and listed["w:$SYS/brokers/+/clients/+/+"][1] >= 1

        await asyncio.to_thread(run)


async def test_a_shared_message_a_member_may_not_read_goes_to_one_that_may(data_dir: Path, secured: dict) -> None:
    """A $share group of eve and admin: whatever member's turn it is, a message on a topic eve
    may not read goes to admin; nothing is lost, and eve gets only what she may read."""
    async with running_gateway(data_dir, **secured) as gw:
        eve = PahoClient(mqtt_port(gw), "eve-member", version=MQTT_5, username="eve", password="pw-eve")
        admin = PahoClient(mqtt_port(gw), "admin-member", version=MQTT_5, username="admin", password="pw-admin")
        for client in (eve, admin):
            await client.connect()
            await client.subscribe("$share/g/#", 1)
        sent = [(f"{kind}/{i}", b"m") for i in range(6) for kind in ("secret", "public")]
        await publish_as_admin(gw, *sent)
        for _ in range(100):  # (each message goes to one member: until all came, or none more does)
            if eve.messages.qsize() + admin.messages.qsize() >= len(sent):
                break
            await asyncio.sleep(0.1)
        got_eve = [m.topic for m in await eve.receive(eve.messages.qsize())]
        got_admin = [m.topic for m in await admin.receive(admin.messages.qsize())]
        assert sorted(got_eve + got_admin) == sorted(topic for topic, _ in sent)
        assert got_eve and all(topic.startswith("public/") for topic in got_eve)
        for client in (eve, admin):
            await client.disconnect()


async def test_a_shared_message_no_member_may_read_is_passed_over(data_dir: Path, secured: dict) -> None:
    """A $share group of eve alone: what she may not read is passed over, and the group goes on
    with what comes after it."""
    async with running_gateway(data_dir, **secured) as gw:
        eve = PahoClient(mqtt_port(gw), "eve-alone", version=MQTT_5, username="eve", password="pw-eve")
        await eve.connect()
        await eve.subscribe("$share/g/#", 1)
        await publish_as_admin(gw, ("secret/1", b"s"), ("public/1", b"p"), ("secret/2", b"s"), ("public/2", b"p"))
        assert [m.topic for m in await eve.receive(2)] == ["public/1", "public/2"]
        await eve.nothing_more()
        await eve.disconnect()
