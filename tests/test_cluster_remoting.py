"""RocketMQ remoting clients on a gateway node (``role = "gateway"`` with ``remoting_bind``), in
one process with its store node: ali-ons sends and consumes through the gateway node only, the
route names the gateway node, the store link's own codes are refused there, and a client's
connection stays up while the store node restarts."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.cluster.store_link import StoreCode
from gateway.config import Config
from gateway.server import Gateway
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.frames import FLAG_ONEWAY
from protocols.remoting.relay_memory import RELAY_PRODUCER, RELAY_SEQ
from protocols.remoting.message_codec import decode_messages, offset_msg_id

from .remoting_support import TEST_DELAY_LEVELS, OnsProcess, RawRemoting, ons, pull_header
from .test_remoting_access import KEYS, secured  # noqa: F401 (secured: a fixture)
from .test_remoting_transactions import COMMIT, GROUP, end_header, send_half, wait_pulled
from .test_store_link import remoting_port


def store_config(data_dir: Path, bind: str = "127.0.0.1:0", **options: Any) -> Config:
    return Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind=bind,
                  remoting_delay_levels=TEST_DELAY_LEVELS, **options)


@asynccontextmanager
async def store_and_node(data_dir: Path, store_options: dict[str, Any] | None = None,
                         **node_options: Any) -> AsyncIterator[tuple[Gateway, Gateway, str]]:
    store = Gateway(store_config(data_dir, **(store_options or {})))
    await store.start()
    node = Gateway(Config(data_dir=data_dir / "unused", role="gateway", node_id="g", mqtt_bind="", amqp_bind="",
                          remoting_bind="127.0.0.1:0", store_address=f"127.0.0.1:{remoting_port(store)}",
                          **node_options))
    try:
        await node.start()
        yield store, node, f"127.0.0.1:{remoting_port(node)}"
    finally:
        await node.stop()
        await store.stop()


def bodies(events: list[dict]) -> list[str]:
    return [e["body"] for e in events if e["event"] == "message"]


async def test_ali_ons_sends_and_consumes_through_the_gateway_node_whose_address_the_route_names(
        data_dir: Path) -> None:
    async with store_and_node(data_dir) as (store, node, addr):
        route = (await ons({"cmd": "route", "nameSrv": addr, "topic": "Relayed"}))[-1]["route"]
        assert [b["brokerAddrs"] for b in route["brokerDatas"]] == [{"0": addr}]
        sent = await ons({"cmd": "send", "nameSrv": addr, "topic": "Relayed",
                          "messages": [{"tags": "A", "body": f"m{i}"} for i in range(10)]})
        assert [e["sendStatus"] for e in sent] == ["SEND_OK"] * 10
        events = await ons({"cmd": "consume", "nameSrv": addr, "group": "g-relayed", "topic": "Relayed",
                            "count": 10, "timeoutMs": 20000, "fromFirst": True})
        assert sorted(bodies(events)) == sorted(f"m{i}" for i in range(10))
        # message ids (store host, port, commitlog offset) name the gateway node too, sent and pulled
        here = offset_msg_id(socket.inet_aton("127.0.0.1"), remoting_port(node), 0)[:16]
        assert {e["msgId"][:16] for e in sent} == {here}
        assert {e["msgId"] for e in events if e["event"] == "message"} == {e["msgId"] for e in sent}
        assert store.remoting is not None and "Relayed" in store.remoting.topics.topics  # stored on the store node
        raw = await RawRemoting.open(addr)
        cluster = await raw.call(RequestCode.GET_BROKER_CLUSTER_INFO)
        assert cluster.code == ResponseCode.SUCCESS
        table = json.loads(cluster.body)["brokerAddrTable"]
        assert [b["brokerAddrs"] for b in table.values()] == [{"0": addr}]
        private = await raw.call(StoreCode.KV_ITEMS, {"table": "remoting.topics"})  # the store link's own
        assert private.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        raw.writer.close()


async def test_a_client_stays_connected_to_the_gateway_node_while_the_store_node_restarts(data_dir: Path) -> None:
    """A held pull in flight when the store node goes is sent again to it when it is back, and
    answered; a send while it is down is answered SERVICE_NOT_AVAILABLE (or, once it is back
    within the hold, SEND_OK); the consumer's heartbeat is said again on the new connection."""
    async with store_and_node(data_dir) as (store, node, addr):
        consumer = await OnsProcess.start({"cmd": "consume", "nameSrv": addr, "group": "g-restart",
                                           "topic": "Restart", "count": 2, "timeoutMs": 40000, "fromFirst": True})
        try:
            await consumer.until("ready")
            await ons({"cmd": "send", "nameSrv": addr, "topic": "Restart", "messages": [{"body": "before"}]})
            assert (await consumer.until("message"))["body"] == "before"
            raw = await RawRemoting.open(addr)
            route = await raw.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Restart"})
            assert route.code == ResponseCode.SUCCESS
            port = remoting_port(store)
            await store.stop()  # the store node goes away ...
            down = await raw.call(RequestCode.SEND_MESSAGE, send_header("Restart"), b"while down", timeout_s=10)
            assert down.code == ResponseCode.SERVICE_NOT_AVAILABLE, down.remark
            store = Gateway(store_config(data_dir, f"127.0.0.1:{port}"))
            await store.start()  # ... and comes back on the same address
            while True:  # (as a client retries: refused until the relay has linked again)
                again = await raw.call(RequestCode.SEND_MESSAGE, send_header("Restart"), b"after", timeout_s=10)
                if again.code == ResponseCode.SUCCESS:  # on the same client connection
                    break
                assert again.code == ResponseCode.SERVICE_NOT_AVAILABLE, again.remark
                await asyncio.sleep(0.1)
            assert (await consumer.until("message"))["body"] == "after"  # the consumer's, too
        finally:
            consumer.kill()
            await store.stop()


async def test_the_gateway_node_closes_a_silent_client_and_one_that_sends_a_bad_frame(data_dir: Path) -> None:
    async with store_and_node(data_dir, connect_timeout_s=0.5) as (_, node, addr):
        silent = await RawRemoting.open(addr)
        assert await asyncio.wait_for(silent.reader.read(100), 5) == b""  # closed: no first request in time
        bad = await RawRemoting.open(addr)
        bad.writer.write(b"\x00\x00\x00\x02\x00\x00")  # a frame shorter than its header length
        assert await asyncio.wait_for(bad.reader.read(100), 5) == b""
        good = await RawRemoting.open(addr)  # the node serves on
        assert (await good.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Still"})).code == ResponseCode.SUCCESS
        good.writer.close()


async def test_signed_requests_are_checked_by_the_store_node_through_the_gateway_node(
        data_dir: Path, secured: dict) -> None:
    """ali-ons' AccessKey signatures reach the store node as signed (the relay changes no field
    they cover): the right secret is served, a wrong one refused, the ACL's denials kept."""
    async with store_and_node(data_dir, {**secured, "cluster_token": "T"}, cluster_token="T") as (store, _, addr):
        ak, sk = KEYS["alice"]
        sent = await ons({"cmd": "send", "nameSrv": addr, "topic": "NodeSigned", "accessKey": ak, "secretKey": sk,
                          "messages": [{"body": "hello"}]})
        assert [e["sendStatus"] for e in sent] == ["SEND_OK"]
        got = await ons({"cmd": "consume", "nameSrv": addr, "group": "GID-node-signed", "topic": "NodeSigned",
                         "accessKey": ak, "secretKey": sk, "count": 1, "fromFirst": True})
        assert bodies(got) == ["hello"]
        refused = await ons({"cmd": "send", "nameSrv": addr, "topic": "NodeSigned", "accessKey": ak,
                             "secretKey": "bad", "reportErrors": True, "messages": [{"body": "refused"}]}, timeout=40)
        assert [e["event"] for e in refused] != ["sent"] and all(e["event"] == "error" for e in refused)
        assert store.remoting is not None and store.remoting.stats.auth_failures > 0
        ak, sk = KEYS["mallory"]
        denied = await ons({"cmd": "send", "nameSrv": addr, "topic": "secret", "accessKey": ak, "secretKey": sk,
                            "reportErrors": True, "messages": [{"body": "leak"}]})
        assert [e["event"] for e in denied] == ["error"]


async def test_a_transaction_check_reaches_the_producer_through_the_gateway_node(data_dir: Path) -> None:
    """The store node's CHECK_TRANSACTION_STATE (its own request, to a live producer of the
    group, known from the heartbeat relayed) comes to the client through the relay, and the
    client's one-way END_TRANSACTION goes back: the half message is committed, then pulled.
    (Frame by frame as the Java client does: no installable client ends transactions.)"""
    store_options = {"remoting_transaction_timeout_s": 0.2, "remoting_transaction_check_interval_s": 0.3}
    async with store_and_node(data_dir, store_options) as (_, _, addr):
        producer = await RawRemoting.open(addr)
        beat = {"clientID": "10.0.0.1@tx", "producerDataSet": [{"groupName": GROUP}], "consumerDataSet": []}
        assert (await producer.call(RequestCode.HEART_BEAT, {}, json.dumps(beat).encode())).code == 0
        offset, _ = await send_half(producer, "NodeOrders", b"checked")
        check = await producer.recv(timeout=5)
        assert check.code == RequestCode.CHECK_TRANSACTION_STATE and int(check.ext_fields["commitLogOffset"]) == offset
        producer.send(RequestCode.END_TRANSACTION, end_header(offset, COMMIT, from_check=True), flag=FLAG_ONEWAY)
        assert [m.body for m in await wait_pulled(producer, "NodeOrders", 1)] == [b"checked"]
        producer.writer.close()


async def test_a_send_numbered_by_a_relay_is_stored_once_however_often_it_comes(data_dir: Path) -> None:
    """What a gateway node's relay does with a send whose answer a failover lost: it sends it
    again with the same number, and the store node answers it as the first time (the same
    message id and queue offset) without storing it twice. Numbers are taken from gateway nodes only (a
    connection that said HELLO with the cluster token)."""
    async with store_and_node(data_dir, {"cluster_token": "T"}, cluster_token="T") as (store, _, _):
        direct = await RawRemoting.open(f"127.0.0.1:{remoting_port(store)}")
        numbered = {**send_header("Numbered"), RELAY_PRODUCER: "relay-test", RELAY_SEQ: "1"}
        refused = await direct.call(RequestCode.SEND_MESSAGE, numbered, b"once")
        assert refused.code == ResponseCode.NO_PERMISSION  # (no HELLO yet)
        assert (await direct.call(StoreCode.HELLO, {"token": "T"})).code == ResponseCode.SUCCESS
        first = await direct.call(RequestCode.SEND_MESSAGE, numbered, b"once")
        again = await direct.call(RequestCode.SEND_MESSAGE, numbered, b"once")
        assert first.code == again.code == ResponseCode.SUCCESS
        assert first.ext_fields["msgId"] == again.ext_fields["msgId"]
        assert first.ext_fields["queueOffset"] == again.ext_fields["queueOffset"] == "0"
        other = await direct.call(RequestCode.SEND_MESSAGE, {**numbered, RELAY_SEQ: "2"}, b"twice")
        assert other.ext_fields["msgId"] != first.ext_fields["msgId"]
        pulled = await direct.call(RequestCode.PULL_MESSAGE, pull_header("Numbered", 0))
        assert [m.body for m in decode_messages(pulled.body)] == [b"once", b"twice"]
        direct.writer.close()


def send_header(topic: str) -> dict[str, str]:
    return {"producerGroup": "raw", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
            "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0", "properties": "",
            "reconsumeTimes": "0", "unitMode": "false"}
