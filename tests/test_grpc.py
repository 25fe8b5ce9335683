"""RocketMQ 5 clients over gRPC (``grpc_bind``), through the official Python client over real
sockets: its Producer's sends are read by MQTT subscribers and a remoting consumer (the C++
client); its SimpleConsumer receives and acks them, and MQTT publishes, by the pop machinery
(invisible until acked, back after their invisible time); route queries create unknown topics
as remoting does; refusals carry the protocol's own status codes (through grpcio stubs, for
what the client checks before sending)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq import client as rmq
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.v5.exception import BadRequestException
from rocketmq.v5.model import Message

from gateway.config import ConfigError, load_config
from protocols.mqtt.packets import MQTT_5
from protocols.remoting.codes import RequestCode
from protocols.remoting.properties import encode_properties
from tests.grpc_support import grpc_gateway, grpc_port, official_producer, official_simple_consumer, raw_stub
from tests.mqtt_support import PahoClient, mqtt_port
from tests.remoting_support import RawRemoting, send_header
from tests.test_remoting_cpp import push_consumer


def normal_message(topic: str, body: bytes, *, tag: str = "", keys: tuple[str, ...] = (),
                   **properties: str) -> Message:
    message = Message()
    message.topic = topic
    message.body = body
    if tag:
        message.tag = tag
    for key in keys:
        message.keys = key  # (the client's setter adds one key)
    for name, value in properties.items():
        message.add_property(name, value)
    return message


@pytest.mark.usefixtures("rocketmq_home")
async def test_official_producer_sends_reach_mqtt_and_remoting_consumers(data_dir: Path) -> None:
    async with grpc_gateway(data_dir, mqtt_bind="127.0.0.1:0") as (gw, endpoint, remoting_addr):
        subscriber = PahoClient(mqtt_port(gw), "grpc-watcher", version=MQTT_5)
        await subscriber.connect()
        await subscriber.subscribe("GrpcOrders", qos=1)
        async with official_producer(endpoint, "GrpcOrders") as producer:
            receipts = [await asyncio.to_thread(producer.send, normal_message(
                "GrpcOrders", f"order-{i}".encode(), tag="paid" if i % 2 == 0 else "open", keys=(f"k{i}",),
                region="eu")) for i in range(4)]
        got = await subscriber.receive(4)
        await subscriber.disconnect()
        assert sorted(m.payload for m in got) == [f"order-{i}".encode() for i in range(4)]
        assert {m.topic for m in got} == {"GrpcOrders"}

        received: asyncio.Queue[dict] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def record(msg: rmq.RecvMessage) -> bool:
            loop.call_soon_threadsafe(received.put_nowait, {
                "body": msg.body.decode(), "tags": msg.tags.decode(), "keys": msg.keys.decode(), "id": msg.id,
                "region": msg["region"].decode()})
            return True
        consumer = await push_consumer(remoting_addr, "CID-grpc", "GrpcOrders", record, "paid")
        try:
            remoting = [await asyncio.wait_for(received.get(), 20) for _ in range(2)]
        finally:
            await asyncio.to_thread(consumer.shutdown)
        ids = {f"order-{i}": receipt.message_id for i, receipt in enumerate(receipts)}
        assert sorted(m["body"] for m in remoting) == ["order-0", "order-2"]
        for m in remoting:
            assert (m["tags"], m["keys"], m["region"]) == ("paid", f"k{m['body'][-1]}", "eu")
            assert m["id"] == ids[m["body"]]  # the gRPC message id is the remoting UNIQ_KEY
        assert len(set(ids.values())) == 4 and all(r.offset >= 0 for r in receipts)


async def test_route_of_an_unknown_topic_creates_it_with_the_default_queues(data_dir: Path) -> None:
    async with grpc_gateway(data_dir, remoting_default_queues=3) as (gw, endpoint, _):
        assert gw.remoting is not None and gw.remoting.topics.get("NewOnGrpc") is None
        async with raw_stub(endpoint) as stub:
            route = await stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="NewOnGrpc")))
            bad = await stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="no spaces")))
            beat = await stub.Heartbeat(rpc.HeartbeatRequest(client_type=pb.PRODUCER))
        assert route.status.code == pb.OK
        assert [q.id for q in route.message_queues] == [0, 1, 2]
        assert {q.permission for q in route.message_queues} == {pb.READ_WRITE}
        assert {tuple(q.accept_message_types) for q in route.message_queues} == {
            (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)}
        addresses = {(a.host, a.port) for q in route.message_queues for a in q.broker.endpoints.addresses}
        assert addresses == {("127.0.0.1", grpc_port(gw))}  # the gRPC listener, not the remoting one
        assert gw.remoting.topics.get("NewOnGrpc").write_queues == 3  # created, as remoting does
        assert bad.status.code == pb.ILLEGAL_TOPIC and not bad.message_queues
        assert beat.status.code == pb.OK


def raw_message(topic: str = "GrpcRaw", body: bytes = b"x", message_type: int = pb.NORMAL,
                **properties: str) -> pb.Message:
    message = pb.Message(topic=pb.Resource(name=topic), body=body, user_properties=properties)
    message.system_properties.message_id = "01AABBCCDDEEFF00112233445566"
    message.system_properties.message_type = message_type
    return message


async def test_sends_refused_with_the_protocols_status_codes(data_dir: Path) -> None:
    fifo = raw_message(message_type=pb.FIFO)  # (without its message group)
    grouped = raw_message()
    grouped.system_properties.message_group = "g1"
    delayed_normal = raw_message()
    delayed_normal.system_properties.delivery_timestamp.FromSeconds(int(time.time()) + 60)
    far = raw_message(message_type=pb.DELAY)
    far.system_properties.delivery_timestamp.seconds = 10 ** 15  # (no Timestamp: past the year 9999)
    unborn = raw_message()
    unborn.system_properties.born_timestamp.seconds = -10 ** 15
    cases = [
        (fifo, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (raw_message(message_type=pb.LITE), pb.UNSUPPORTED),  # (not taken over gRPC yet: never stored)
        (raw_message(TRAN_MSG="true"), pb.ILLEGAL_MESSAGE_PROPERTY_KEY),  # (only a TRANSACTION message's)
        (raw_message(__SHARDINGKEY="g1"), pb.ILLEGAL_MESSAGE_PROPERTY_KEY),  # (only a FIFO message's)
        (raw_message(message_type=pb.DELAY), pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),  # (no delivery time)
        (delayed_normal, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (far, pb.ILLEGAL_DELIVERY_TIME),
        (unborn, pb.BAD_REQUEST),
        (raw_message(TIMER_DELIVER_MS="1"), pb.ILLEGAL_MESSAGE_PROPERTY_KEY),  # (only a DELAY message's)
        (grouped, pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (raw_message(body=b""), pb.MESSAGE_BODY_EMPTY),
        (raw_message(topic="bad topic"), pb.ILLEGAL_TOPIC),
        (raw_message(**{"rmq.ot": "x"}), pb.ILLEGAL_MESSAGE_PROPERTY_KEY),  # the gateway's internal ones
        (raw_message(TAGS="t"), pb.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ]
    async with grpc_gateway(data_dir) as (gw, endpoint, _):
        async with raw_stub(endpoint) as stub:
            answers = [(await stub.SendMessage(rpc.SendMessageRequest(messages=[m]))).status.code
                       for m, _ in cases]
            two = await stub.SendMessage(rpc.SendMessageRequest(messages=[raw_message(), raw_message()]))
            sent = await stub.SendMessage(rpc.SendMessageRequest(messages=[raw_message()]))
            forever = [r.status.code async for r in stub.ReceiveMessage(rpc.ReceiveMessageRequest(
                group=pb.Resource(name="GID-raw"), message_queue=pb.MessageQueue(topic=pb.Resource(name="GrpcRaw")),
                batch_size=1, invisible_duration=Duration(seconds=1 << 62)))]  # (its due time: no u64)
            with pytest.raises(grpc.aio.AioRpcError) as missing:  # not built yet: said so, not faked
                await stub.RecallMessage(rpc.RecallMessageRequest())
        assert answers == [code for _, code in cases]
        assert two.status.code == pb.UNSUPPORTED
        assert sent.status.code == pb.OK and sent.entries[0].offset == 0  # nothing refused was stored
        assert forever == [pb.ILLEGAL_INVISIBLE_TIME]
        assert missing.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_sends_under_the_resource_alarm_are_too_many_requests(data_dir: Path) -> None:
    async with grpc_gateway(data_dir) as (gw, endpoint, _):
        assert gw.pressure is not None
        gw.pressure.disk_free_limit = 1 << 62  # no free space is enough: the alarm
        gw.pressure.check()
        async with raw_stub(endpoint) as stub:
            blocked = await stub.SendMessage(rpc.SendMessageRequest(messages=[raw_message()]))
            gw.pressure.disk_free_limit = 0
            gw.pressure.check()
            sent = await stub.SendMessage(rpc.SendMessageRequest(messages=[raw_message()]))
        assert blocked.status.code == pb.TOO_MANY_REQUESTS and "blocked" in blocked.status.message
        assert sent.status.code == pb.OK and sent.entries[0].offset == 0  # the refused one was not stored


async def receive_all(consumer, count: int, invisible_s: int = 30) -> list[Message]:
    got: list[Message] = []
    for _ in range(10):
        if len(got) >= count:
            break
        got.extend(await asyncio.to_thread(consumer.receive, 16, invisible_s))
    return got


async def test_simple_consumer_receives_and_acks_what_the_producer_sent(data_dir: Path) -> None:
    async with grpc_gateway(data_dir) as (gw, endpoint, _):
        async with official_producer(endpoint, "GrpcJobs") as producer:
            receipts = {(await asyncio.to_thread(producer.send, normal_message(
                "GrpcJobs", f"job-{i}".encode(), tag="paid" if i < 3 else "open", keys=(f"k{i}",), step=str(i))
            )).message_id: i for i in range(5)}
        async with official_simple_consumer(endpoint, "GID-jobs", "GrpcJobs", "paid") as consumer:
            got = await receive_all(consumer, 3)
            assert sorted(m.body for m in got) == [b"job-0", b"job-1", b"job-2"]  # (the TAG filter)
            for m in got:
                i = receipts[m.message_id]
                assert (m.tag, m.keys, m.properties, m.delivery_attempt) == ("paid", {f"k{i}"}, {"step": str(i)}, 1)
                await asyncio.to_thread(consumer.ack, m)
            assert await asyncio.to_thread(consumer.receive, 16, 30) == []  # MESSAGE_NOT_FOUND, after the wait
        async with raw_stub(endpoint) as stub:
            again = await stub.AckMessage(rpc.AckMessageRequest(
                group=pb.Resource(name="GID-jobs"), topic=pb.Resource(name="GrpcJobs"),
                entries=[rpc.AckMessageEntry(message_id=got[0].message_id, receipt_handle=got[0].receipt_handle),
                         rpc.AckMessageEntry(message_id="x", receipt_handle="not ours")]))
            empty = [r async for r in stub.ReceiveMessage(rpc.ReceiveMessageRequest(
                group=pb.Resource(name="GID-jobs"), message_queue=pb.MessageQueue(topic=pb.Resource(name="GrpcJobs")),
                filter_expression=pb.FilterExpression(type=pb.TAG, expression="paid"), batch_size=4,
                invisible_duration=Duration(seconds=30)))]
            unknown = [r async for r in stub.ReceiveMessage(rpc.ReceiveMessageRequest(
                group=pb.Resource(name="GID-jobs"), message_queue=pb.MessageQueue(topic=pb.Resource(name="Nope")),
                batch_size=4, invisible_duration=Duration(seconds=30)))]
        assert again.status.code == pb.INVALID_RECEIPT_HANDLE  # acked already; and not a handle of ours
        assert [e.status.code for e in again.entries] == [pb.INVALID_RECEIPT_HANDLE] * 2
        assert [r.status.code for r in empty] == [pb.MESSAGE_NOT_FOUND]
        assert [r.status.code for r in unknown] == [pb.TOPIC_NOT_FOUND]


async def test_simple_consumer_gets_mqtt_publishes_and_unacked_messages_come_back(data_dir: Path) -> None:
    async with grpc_gateway(data_dir, mqtt_bind="127.0.0.1:0") as (gw, endpoint, _):
        async with official_simple_consumer(endpoint, "GID-devices", "GrpcDevices") as consumer:
            device = PahoClient(mqtt_port(gw), "dev-7", version=MQTT_5)
            await device.connect()
            await device.publish("GrpcDevices/dev-7/temp", b"21.5", qos=1)
            await device.disconnect()
            first = await receive_all(consumer, 1, invisible_s=1)  # not acked: back after a second
            assert [(m.body, m.properties["mqttSecondTopic"], m.delivery_attempt) for m in first] == [
                (b"21.5", "/dev-7/temp", 1)]
            again = await receive_all(consumer, 1)
            assert [(m.body, m.message_id, m.delivery_attempt) for m in again] == [
                (b"21.5", first[0].message_id, 2)]
            await asyncio.to_thread(consumer.ack, again[0])
            with pytest.raises(BadRequestException) as gone:  # its first receipt is gone
                await asyncio.to_thread(consumer.ack, first[0])
        assert gone.value.code == pb.INVALID_RECEIPT_HANDLE


async def test_a_changed_invisible_duration_keeps_the_message_away(data_dir: Path) -> None:
    async with grpc_gateway(data_dir) as (_, endpoint, _):
        async with official_producer(endpoint, "GrpcSlow") as producer:
            await asyncio.to_thread(producer.send, normal_message("GrpcSlow", b"slow job"))
        async with official_simple_consumer(endpoint, "GID-slow", "GrpcSlow") as consumer:
            [message] = await receive_all(consumer, 1, invisible_s=1)
            first_handle = message.receipt_handle
            await asyncio.to_thread(consumer.change_invisible_duration, message, 30)  # (takes the new handle)
            await asyncio.sleep(1.5)  # past the first invisible time
            assert await asyncio.to_thread(consumer.receive, 16, 30) == []  # still invisible
            await asyncio.to_thread(consumer.ack, message)
            message.receipt_handle = first_handle
            with pytest.raises(BadRequestException) as gone:
                await asyncio.to_thread(consumer.change_invisible_duration, message, 30)
        assert gone.value.code == pb.INVALID_RECEIPT_HANDLE


async def test_delay_messages_are_received_from_their_delivery_time(data_dir: Path) -> None:
    async with grpc_gateway(data_dir, mqtt_bind="127.0.0.1:0") as (gw, endpoint, _):
        subscriber = PahoClient(mqtt_port(gw), "delay-watcher", version=MQTT_5)
        await subscriber.connect()
        await subscriber.subscribe("GrpcLater", qos=1)
        due_s = int(time.time()) + 4  # (the client sends whole seconds)
        async with official_producer(endpoint, "GrpcLater") as producer:
            later = normal_message("GrpcLater", b"later", tag="t")
            later.delivery_timestamp = due_s
            sent = await asyncio.to_thread(producer.send, later)
            await asyncio.to_thread(producer.send, normal_message("GrpcLater", b"now"))
        async with official_simple_consumer(endpoint, "GID-later", "GrpcLater") as consumer:
            got: list[tuple[Message, float]] = []
            while len(got) < 2:
                got.extend((m, time.time()) for m in await asyncio.to_thread(consumer.receive, 16, 30))
        [(now, _), (delayed, received_at)] = got
        assert now.body == b"now" and not now.delivery_timestamp
        assert (delayed.body, delayed.message_id, delayed.tag) == (b"later", sent.message_id, "t")
        assert delayed.delivery_timestamp == due_s * 1000 and received_at >= due_s - 0.05  # (never early)
        assert delayed.properties == {}  # (the timer's properties are not the user's)
        mqtt = await subscriber.receive(2)
        await subscriber.disconnect()
        assert [m.payload for m in mqtt] == [b"now", b"later"]  # MQTT subscribers get it then too


async def test_a_message_forwarded_to_the_dead_letter_queue_is_read_there_and_not_again(data_dir: Path) -> None:
    async with grpc_gateway(data_dir) as (_, endpoint, _):
        async with official_producer(endpoint, "GrpcPoison") as producer:
            sent = await asyncio.to_thread(producer.send, normal_message("GrpcPoison", b"poison", tag="bad"))
        async with official_simple_consumer(endpoint, "GID-poison", "GrpcPoison") as consumer:
            [message] = await receive_all(consumer, 1, invisible_s=1)
            forward = rpc.ForwardMessageToDeadLetterQueueRequest(
                group=pb.Resource(name="GID-poison"), topic=pb.Resource(name="GrpcPoison"),
                receipt_handle=message.receipt_handle, message_id=message.message_id, delivery_attempt=1,
                max_delivery_attempts=1)
            async with raw_stub(endpoint) as stub:
                moved = await stub.ForwardMessageToDeadLetterQueue(forward)
                again = await stub.ForwardMessageToDeadLetterQueue(forward)
            await asyncio.sleep(1.5)  # (past its invisible time: it would be back, were it not moved)
            assert await asyncio.to_thread(consumer.receive, 16, 30) == []
        assert (moved.status.code, again.status.code) == (pb.OK, pb.INVALID_RECEIPT_HANDLE)
        async with official_simple_consumer(endpoint, "GID-poison-dlq", "%DLQ%GID-poison") as dead:
            [buried] = await receive_all(dead, 1)
        assert (buried.body, buried.message_id, buried.tag) == (b"poison", sent.message_id, "bad")


async def test_a_remoting_send_with_odd_times_is_received(data_dir: Path) -> None:
    """A remoting sender's born time and TIMER_OUT_MS are any numbers it chose: a gRPC receive
    shows what a protobuf Timestamp holds and leaves out the rest, never fails on them."""
    async with grpc_gateway(data_dir) as (_, endpoint, remoting_addr):
        raw = await RawRemoting.open(remoting_addr)
        odd = {"bornTimestamp": str(10 ** 18), "properties": encode_properties({"TIMER_OUT_MS": "99" * 12})}
        sent = await raw.call(RequestCode.SEND_MESSAGE, send_header("GrpcOddTimes", **odd), b"odd times")
        raw.close()
        assert sent.code == 0, sent.remark
        async with official_simple_consumer(endpoint, "GID-odd", "GrpcOddTimes") as consumer:
            [got] = await receive_all(consumer, 1)
        assert got.body == b"odd times" and not got.delivery_timestamp


def fifo_message(topic: str, body: bytes, group: str) -> Message:
    message = normal_message(topic, body)
    message.message_group = group
    return message


async def test_fifo_messages_are_received_in_order_under_two_consumers(data_dir: Path) -> None:
    """One queue: while a member holds messages of it, the other receives none of it; one not
    acked in time comes back, first, to either member; then the rest, in the order sent."""
    async with grpc_gateway(data_dir, remoting_default_queues=1) as (gw, endpoint, _):
        async with official_producer(endpoint, "GrpcFifo") as producer:
            for i in range(3):
                for group in ("a", "b"):
                    await asyncio.to_thread(producer.send, fifo_message("GrpcFifo", f"{group}{i}".encode(), group))
        async with official_simple_consumer(endpoint, "GID-fifo", "GrpcFifo") as one, \
                official_simple_consumer(endpoint, "GID-fifo", "GrpcFifo") as two:
            first = await asyncio.to_thread(one.receive, 2, 30)
            assert [(m.body, m.message_group) for m in first] == [(b"a0", "a"), (b"b0", "b")]
            assert await asyncio.to_thread(two.receive, 2, 30) == []  # (the queue's order is out to one)
            for m in first:
                await asyncio.to_thread(one.ack, m)
            second = await asyncio.to_thread(two.receive, 2, 1)  # not acked: back after a second
            assert [m.body for m in second] == [b"a1", b"b1"]
            again: list[Message] = []
            while not again:  # (a long poll may end before they are back)
                again = await asyncio.to_thread(one.receive, 2, 30)
            assert [(m.body, m.delivery_attempt) for m in again] == [(b"a1", 2), (b"b1", 2)]  # before a2
            for m in again:
                await asyncio.to_thread(one.ack, m)
            last = await asyncio.to_thread(two.receive, 2, 30)
            assert [m.body for m in last] == [b"a2", b"b2"]
            for m in last:
                await asyncio.to_thread(two.ack, m)
            assert await asyncio.to_thread(one.receive, 2, 30) == []


async def test_a_fifo_message_out_across_a_restart_still_holds_its_queue(data_dir: Path) -> None:
    async with grpc_gateway(data_dir, remoting_default_queues=1) as (_, endpoint, _):
        async with official_producer(endpoint, "GrpcFifoRestart") as producer:
            for body in (b"first", b"second"):
                await asyncio.to_thread(producer.send, fifo_message("GrpcFifoRestart", body, "g"))
        async with official_simple_consumer(endpoint, "GID-restart", "GrpcFifoRestart") as consumer:
            [out] = await asyncio.to_thread(consumer.receive, 1, 60)
            assert out.body == b"first"
    async with grpc_gateway(data_dir, remoting_default_queues=1) as (_, endpoint, _):
        async with official_simple_consumer(endpoint, "GID-restart", "GrpcFifoRestart") as consumer:
            assert await asyncio.to_thread(consumer.receive, 1, 60) == []  # (first is still out)
            async with raw_stub(endpoint) as stub:
                acked = await stub.AckMessage(rpc.AckMessageRequest(
                    group=pb.Resource(name="GID-restart"), topic=pb.Resource(name="GrpcFifoRestart"),
                    entries=[rpc.AckMessageEntry(message_id=out.message_id, receipt_handle=out.receipt_handle)]))
            assert acked.status.code == pb.OK
            assert [m.body for m in await asyncio.to_thread(consumer.receive, 1, 60)] == [b"second"]


async def test_fifo_groups_keep_their_order_under_two_busy_consumers(data_dir: Path) -> None:
    async with grpc_gateway(data_dir, remoting_default_queues=2) as (gw, endpoint, _):
        groups = ("north", "south", "east")
        async with official_producer(endpoint, "GrpcFifoBusy") as producer:
            for i in range(8):
                for group in groups:
                    await asyncio.to_thread(producer.send, fifo_message("GrpcFifoBusy", f"{group}-{i}".encode(), group))
        handled: list[str] = []

        async def consume(consumer) -> None:
            for _ in range(200):
                if len(handled) >= 8 * len(groups):
                    return
                for m in await asyncio.to_thread(consumer.receive, 3, 30):
                    handled.append(m.body.decode())  # (handled, then acked: the next of its queue may go)
                    await asyncio.to_thread(consumer.ack, m)
        async with official_simple_consumer(endpoint, "GID-busy", "GrpcFifoBusy", await_s=1) as one, \
                official_simple_consumer(endpoint, "GID-busy", "GrpcFifoBusy", await_s=1) as two:
            await asyncio.gather(consume(one), consume(two))
        for group in groups:
            assert [b for b in handled if b.startswith(group)] == [f"{group}-{i}" for i in range(8)]


def test_grpc_bind_is_refused_where_it_cannot_be_served() -> None:
    assert load_config(env={}).grpc_bind == ""  # off by default
    with pytest.raises(ConfigError, match="grpc_bind needs remoting_bind"):
        load_config(env={}, overrides={"grpc_bind": "127.0.0.1:8081", "remoting_bind": ""})
    secured = load_config(env={}, overrides={"grpc_bind": "127.0.0.1:8081", "acl_file": "acl.toml"})
    assert secured.grpc_bind  # (its calls are signed and checked: access.py)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        load_config(env={}, overrides={"grpc_bind": "8081"})
