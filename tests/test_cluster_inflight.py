"""Unacknowledged deliveries on gateway nodes (``role = "gateway"``): a message a gateway node
has not fetched (or no longer holds) is not one retention removed. Resent after a takeover on
the same node and after a move to another node, however many there are. (Shared subscriptions,
whose members give theirs back, are refused on gateway nodes: test_cluster_shared.py.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gateway.cluster.store_service import StoreService
from gateway.mqtt.session import SESSIONS_TABLE
from gateway.remoting.requests import Pending
from protocols.mqtt.packets import MQTT_3_1_1, Connect, Publish, PubRec, PubRel, SubAck, Subscribe, Subscription
from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand, response_to

from .mqtt_support import PahoClient, RawClient, mqtt_port
from .test_cluster_mqtt import cluster


async def subscribed(port: int, client_id: str, topic_filter: str, qos: int, *, clean: bool = False) -> RawClient:
    """A raw client (it acknowledges nothing unless told) subscribed."""
    client, connack = await RawClient.connected(port, Connect(client_id, MQTT_3_1_1, clean_start=clean))
    assert connack.reason_code == 0
    client.send(Subscribe(1, [Subscription(topic_filter, qos)]))
    assert isinstance(await client.recv(), SubAck)
    return client


async def publishes(client: RawClient, count: int) -> list[Publish]:
    got = []
    for _ in range(count):
        packet = await client.recv()
        assert isinstance(packet, Publish), packet
        got.append(packet)
    return got


@pytest.mark.parametrize("qos", [1, 2])
async def nothing_more(client: RawClient) -> None:
    with pytest.raises(asyncio.TimeoutError):
        packet = await client.recv(timeout=0.5)
        raise AssertionError(f"unexpected {packet}")


@pytest.mark.parametrize("qos", [1, 2])
async def test_unacknowledged_delivery_is_resent_after_a_takeover_on_the_same_node(data_dir: Path, qos: int) -> None:
    async with cluster(data_dir) as (_, (a, b)):
        first = await subscribed(mqtt_port(a), "dev", "cmd/dev", qos)
        sender = PahoClient(mqtt_port(b), "ops")
        await sender.connect()
        await sender.publish("cmd/dev", "reboot", qos)
        [sent] = await publishes(first, 1)
        assert sent.payload == b"reboot"  # (not acknowledged)
        # the same client id again, on the same node, while the first connection is still open
        second, connack = await RawClient.connected(mqtt_port(a), Connect("dev", MQTT_3_1_1, clean_start=False))
        assert connack.session_present
        again = await publishes(second, 1)
        # resent from the session's inflight table, with its packet id (MQTT 3.1.1 section 4.4)
        assert [(p.payload, p.qos, p.dup, p.packet_id) for p in again] == [(b"reboot", qos, True, sent.packet_id)]
        await nothing_more(second)
        await first.close()
        await second.close()
        await sender.disconnect()


async def test_every_unreleased_qos2_delivery_is_resent_on_another_node(data_dir: Path) -> None:
    """More unacknowledged QoS 2 messages than a gateway node keeps read by position (4096):
    each is resent once, with DUP, in order, and none is delivered again as a new message."""
    count = 4500
    async with cluster(data_dir) as (_, (a, b)):
        device = await subscribed(mqtt_port(a), "dev", "bulk/dev", 2)
        sender = PahoClient(mqtt_port(a), "ops")
        sender.client.max_inflight_messages_set(256)
        await sender.connect()
        infos = [sender.client.publish("bulk/dev", str(i), 2) for i in range(count)]
        for info in infos:
            await asyncio.to_thread(info.wait_for_publish, 10)
        assert [int(p.payload) for p in await publishes(device, count)] == list(range(count))
        await device.close()  # none acknowledged
        await asyncio.sleep(0.3)  # node a writes the session back
        moved, connack = await RawClient.connected(mqtt_port(b), Connect("dev", MQTT_3_1_1, clean_start=False))
        assert connack.session_present
        again = await publishes(moved, count)
        assert [int(p.payload) for p in again] == list(range(count))
        assert all(p.dup for p in again)
        await nothing_more(moved)
        await moved.close()
        await sender.disconnect()


async def test_a_session_back_on_its_node_gets_its_qos2_resend(data_dir: Path) -> None:
    """The session is written back when its client leaves and loaded again when it returns: an
    unreleased QoS 2 delivery is resent (DUP)."""
    async with cluster(data_dir) as (_, (a, b)):
        device, _ = await RawClient.connected(mqtt_port(a), Connect("dev", MQTT_3_1_1, clean_start=False))
        device.send(Subscribe(1, [Subscription("cmd/dev", 2)]))
        assert isinstance(await device.recv(), SubAck)
        sender = PahoClient(mqtt_port(b), "ops")
        await sender.connect()
        await sender.publish("cmd/dev", "reboot", 2)
        assert [p.payload for p in await publishes(device, 1)] == [b"reboot"]  # (no PUBREC)
        await device.close()
        await asyncio.sleep(0.3)  # node a writes the session back
        back, connack = await RawClient.connected(mqtt_port(a), Connect("dev", MQTT_3_1_1, clean_start=False))
        assert connack.session_present
        got = await publishes(back, 1)
        assert [(p.payload, p.dup) for p in got] == [(b"reboot", True)]
        await nothing_more(back)
        await back.close()
        await sender.disconnect()


async def test_a_gateway_nodes_qos2_state_is_on_the_store_node_before_the_client_sees_it(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write-ahead on a gateway node, with a store node slow to write sessions (each KV_PUT
    handled 0.3 s late): when the client reads a QoS 2 PUBLISH, the store node has the session's
    record of it (packet id, not released); when it reads the PUBREL, the record says released.
    A kill -9 of the gateway node in between loses neither (before: one-way writes that left
    after the packet)."""
    handle_now = StoreService.kv_put

    def slow_kv_put(service: StoreService, conn: object, request: RemotingCommand) -> Pending | None:
        written = asyncio.get_running_loop().create_future()

        def write() -> None:
            handle_now(service, conn, request)  # type: ignore[arg-type]
            written.set_result(None)
        asyncio.get_running_loop().call_later(0.3, write)
        return None if request.is_oneway else Pending(written, lambda _: response_to(request, ResponseCode.SUCCESS))

    monkeypatch.setattr(StoreService, "kv_put", slow_kv_put)
    async with cluster(data_dir) as (store, (a, b)):
        sessions = store.store.table(SESSIONS_TABLE)

        def q2out() -> dict[int, bool]:
            raw = sessions.get("dev")
            return {pid: released for pid, _, _, _, qos, released in json.loads(raw)["out"] if qos == 2} if raw else {}

        device = await subscribed(mqtt_port(a), "dev", "wal/dev", 2)
        sender = PahoClient(mqtt_port(b), "ops")
        await sender.connect()
        await sender.publish("wal/dev", "once", 2)
        [publish] = await publishes(device, 1)
        assert q2out() == {publish.packet_id: False}
        device.send(PubRec(publish.packet_id))
        assert await device.recv() == PubRel(publish.packet_id)
        assert q2out() == {publish.packet_id: True}
        await device.close()
        await sender.disconnect()
