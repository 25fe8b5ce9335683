"""SQL92 subscriptions end to end: ali-ons (its ``{expressionType: 'SQL92', subString}``
selector) and frame-level requests written as apache/rocketmq's Java client writes them
(``PullAPIWrapper.pullKernelImpl`` -> ``MQClientAPIImpl.pullMessage``: PullMessageRequestHeader
with subscription and expressionType; ``MQClientInstance.sendHeartbeatToAllBroker``:
HeartbeatData JSON; ``MQClientAPIImpl.checkClientInBroker``: CHECK_CLIENT_CONFIG with a
CheckClientRequestBody). The C++ client in PyPI's ``rocketmq`` subscribes by tag only. MQTT
publishes into a remoting topic are selected by the properties their remoting readers see."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.remoting.requests import BadRequest
from gateway.remoting.selectors import SELECT_ALL, Selectors
from protocols.mqtt.packets import MQTT_5
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.message_codec import decode_messages
from protocols.remoting.properties import BatchItem, encode_batch_body, encode_properties
from protocols.remoting.sql92 import MAX_EXPRESSION_CHARS
from tests.mqtt_support import PahoClient, mqtt_port
from tests.remoting_support import OnsProcess, RawRemoting, ons, remoting_gateway, send_header

# PullSysFlag (Java client): commit offset 1, suspend 2, subscription 4
FLAG_SUSPEND, FLAG_SUBSCRIPTION = 0x2, 0x4

ORDERS = [  # (body, properties)
    ("o1", {"region": "eu", "price": "15", "TAGS": "retail"}),
    ("o2", {"region": "us", "price": "15", "TAGS": "retail"}),
    ("o3", {"region": "eu", "price": "150", "TAGS": "retail"}),
    ("o4", {"region": "eu", "price": "99.5", "TAGS": "vip"}),
    ("o5", {"price": "20", "TAGS": "vip"}),
    ("o6", {"region": "apac", "TAGS": "retail"}),
    ("o7", {"region": "eu", "price": "abc", "TAGS": "retail"}),
    ("o8", {"region": "eu", "price": "10", "TAGS": "retail"}),
]
SELECTOR = "(region IN ('eu', 'apac') AND price BETWEEN 10.0 AND 100.0) OR TAGS = 'vip'"
MATCHING = ["o1", "o4", "o5", "o8"]  # o6: no price (unknown); o7: price does not parse


def sql_pull(topic: str, offset: int, expression: str | None, *, suspend_ms: int = 0, group: str = "sql-g",
             max_msgs: int = 32) -> dict[str, str]:
    """A PullMessageRequestHeader as the Java client sends it."""
    flags = (FLAG_SUSPEND if suspend_ms else 0) | (FLAG_SUBSCRIPTION if expression is not None else 0)
    header = {"consumerGroup": group, "topic": topic, "queueId": "0", "queueOffset": str(offset),
              "maxMsgNums": str(max_msgs), "sysFlag": str(flags), "commitOffset": "0",
              "suspendTimeoutMillis": str(suspend_ms), "subVersion": "1", "expressionType": "SQL92"}
    if expression is not None:
        header["subscription"] = expression
    return header


async def one_queue_topic(client: RawRemoting, topic: str) -> None:
    reply = await client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": topic, "readQueueNums": "1",
                                                                    "writeQueueNums": "1"})
    assert reply.code == ResponseCode.SUCCESS


async def send(client: RawRemoting, topic: str, body: str, props: dict[str, str]) -> None:
    reply = await client.call(RequestCode.SEND_MESSAGE, send_header(topic, properties=encode_properties(props)),
                              body.encode())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


def bodies(reply) -> list[str]:
    return [m.body.decode() for m in decode_messages(reply.body)] if reply.body else []


async def test_ons_sql92_consumer_gets_exactly_the_matching_messages(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        sent = await ons({"cmd": "send", "nameSrv": addr, "topic": "SqlOrders", "messages": [
            {"tags": props.pop("TAGS"), "body": body, "properties": props} for body, props in
            ((b, dict(p)) for b, p in ORDERS)]})
        assert [e["sendStatus"] for e in sent] == ["SEND_OK"] * len(ORDERS)
        events = await ons({"cmd": "consume", "nameSrv": addr, "group": "g-sql", "topic": "SqlOrders",
                            "expressionType": "SQL92", "expression": SELECTOR, "count": len(MATCHING),
                            "timeoutMs": 20000, "lingerMs": 1500})
        got = [e for e in events if e["event"] == "message"]
        assert sorted(m["body"] for m in got) == MATCHING  # and nothing else, even after lingering
        assert all(m["properties"]["TAGS"] == m["tags"] for m in got)


async def test_ons_consumer_with_a_bad_expression_gets_subscription_parse_failed(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        await ons({"cmd": "send", "nameSrv": addr, "topic": "SqlBad", "messages": [{"body": "x"}]})
        process = await OnsProcess.start({"cmd": "consume", "nameSrv": addr, "group": "g-bad", "topic": "SqlBad",
                                          "expressionType": "SQL92", "expression": "price > > 5",
                                          "reportErrors": True, "timeoutMs": 15000})
        try:
            error = await process.until("error", timeout=20.0)
        finally:
            process.kill()
        assert error["code"] == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert 'Encountered ">" at line 1, column 9' in error["message"]
        assert not [e for e in process.events if e["event"] == "message"]


async def test_pull_selects_by_properties_and_moves_past_the_rest(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        client = await RawRemoting.open(addr)
        await one_queue_topic(client, "SqlPull")
        for body, props in ORDERS:
            await send(client, "SqlPull", body, props)
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlPull", 0, SELECTOR))
        assert reply.code == ResponseCode.SUCCESS and bodies(reply) == MATCHING
        assert reply.ext_fields["nextBeginOffset"] == "8"
        [o4] = [m for m in decode_messages(reply.body) if m.body == b"o4"]
        assert o4.queue_offset == 3 and o4.properties["price"] == "99.5"
        # a small batch: the matches of the first reads only, and where to go on from
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlPull", 0, SELECTOR, max_msgs=2))
        assert bodies(reply) == ["o1"] and reply.ext_fields["nextBeginOffset"] == "2"
        # nothing matches up to the end: told to go on from the end
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlPull", 0, "region = 'mars'"))
        assert reply.code == ResponseCode.PULL_NOT_FOUND and reply.ext_fields["nextBeginOffset"] == "8"
        # the system properties RocketMQ exposes (TAGS, KEYS...) are there; ours (rmq.*) are not
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlPull", 0, "TAGS = 'vip'"))
        assert bodies(reply) == ["o4", "o5"]
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlPull", 0, "rmq.bh IS NOT NULL"))
        assert reply.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED  # ('.' is not in a name)
        client.close()


async def test_a_long_scan_answers_retry_immediately_from_where_it_stopped(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        client = await RawRemoting.open(addr)
        await one_queue_topic(client, "SqlScan")
        items = [BatchItem(0, b"skip", encode_properties({"n": str(i)})) for i in range(1000)]
        reply = await client.call(RequestCode.SEND_BATCH_MESSAGE, send_header("SqlScan"), encode_batch_body(items))
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        await send(client, "SqlScan", "wanted", {"n": "wanted"})
        offset, got, pulls = 0, [], 0
        while not got:
            pulls += 1
            assert pulls <= 10
            reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlScan", offset, "n = 'wanted'"))
            assert reply.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY)
            assert int(reply.ext_fields["nextBeginOffset"]) > offset
            offset = int(reply.ext_fields["nextBeginOffset"])
            got = bodies(reply)
        assert got == ["wanted"] and offset == 1001 and pulls >= 2  # (one pull scans a bounded amount)
        client.close()


async def test_a_held_pull_waits_on_past_messages_that_do_not_match(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        consumer = await RawRemoting.open(addr)
        producer = await RawRemoting.open(addr)
        await one_queue_topic(producer, "SqlPoll")
        opaque = consumer.send(RequestCode.PULL_MESSAGE, sql_pull("SqlPoll", 0, "kind = 'alert'", suspend_ms=15_000))
        await send(producer, "SqlPoll", "noise-1", {"kind": "metric"})
        await send(producer, "SqlPoll", "noise-2", {})
        with pytest.raises(TimeoutError):  # still held: what came does not match
            await consumer.recv(timeout=0.5)
        await send(producer, "SqlPoll", "alert", {"kind": "alert"})
        reply = await consumer.recv()
        assert reply.opaque == opaque and reply.code == ResponseCode.SUCCESS
        assert bodies(reply) == ["alert"] and reply.ext_fields["nextBeginOffset"] == "3"
        # a hold that ends by its timeout says where to go on: past what it skipped
        opaque = consumer.send(RequestCode.PULL_MESSAGE, sql_pull("SqlPoll", 3, "kind = 'alert'", suspend_ms=800))
        await send(producer, "SqlPoll", "noise-3", {"kind": "metric"})
        reply = await consumer.recv()
        assert reply.opaque == opaque and reply.code == ResponseCode.PULL_NOT_FOUND
        assert reply.ext_fields["nextBeginOffset"] == "4"
        consumer.close()
        producer.close()


def heartbeat(group: str, topic: str, expression: str, expression_type: str = "SQL92") -> bytes:
    """HeartbeatData as the Java client serialises it (ConsumerData, SubscriptionData)."""
    return json.dumps({"clientID": "127.0.0.1@sql", "producerDataSet": [], "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
        "subscriptionDataSet": [{"classFilterMode": False, "topic": topic, "subString": expression,
                                 "tagsSet": [], "codeSet": [], "subVersion": 1, "expressionType": expression_type}],
    }]}).encode()


async def test_pull_without_subscription_uses_the_heartbeat_one(data_dir: Path) -> None:
    # (the Java push consumer's default: postSubscriptionWhenPull=false)
    async with remoting_gateway(data_dir) as (_, addr):
        client = await RawRemoting.open(addr)
        await one_queue_topic(client, "SqlBeat")
        for body, props in ORDERS:
            await send(client, "SqlBeat", body, props)
        reply = await client.call(RequestCode.HEART_BEAT, body=heartbeat("beat-g", "SqlBeat", "price > 20.0"))
        assert reply.code == ResponseCode.SUCCESS
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlBeat", 0, None, group="beat-g"))
        assert bodies(reply) == ["o3", "o4"]
        client.close()


async def test_bad_expressions_get_subscription_parse_failed_with_the_reason(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        client = await RawRemoting.open(addr)
        await one_queue_topic(client, "SqlErr")
        await send(client, "SqlErr", "x", {"a": "1"})
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlErr", 0, "a BETWEEN 5 AND 1"))
        assert reply.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert "left value(5) must less than or equal to right value(1) (at line 1, column 3)" in reply.remark
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlErr", 0, "a = 1 AND"))
        assert reply.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
        assert "Encountered end of input at line 1, column 10" in reply.remark
        reply = await client.call(RequestCode.PULL_MESSAGE, {**sql_pull("SqlErr", 0, "a"), "expressionType": "XPATH"})
        assert reply.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "XPATH" in reply.remark
        # a heartbeat with a bad expression is taken (as RocketMQ's); its pulls are refused
        await client.call(RequestCode.HEART_BEAT, body=heartbeat("bad-g", "SqlErr", "a = = 1"))
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlErr", 0, None, group="bad-g"))
        assert reply.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and 'Encountered "="' in reply.remark
        # the Java push consumer's start-up check
        for expression, kind, code in (("a = = 1", "SQL92", ResponseCode.SUBSCRIPTION_PARSE_FAILED),
                                       ("a = 1", "SQL92", ResponseCode.SUCCESS),
                                       ("TagA || TagB", "TAG", ResponseCode.SUCCESS)):
            body = json.dumps({"clientId": "127.0.0.1@sql", "group": "g", "subscriptionData": {
                "topic": "SqlErr", "subString": expression, "expressionType": kind, "classFilterMode": False,
                "tagsSet": [], "codeSet": [], "subVersion": 1}}).encode()
            reply = await client.call(RequestCode.CHECK_CLIENT_CONFIG, body=body)
            assert reply.code == code, reply.remark
        assert 'Encountered "="' in reply.remark if reply.code != ResponseCode.SUCCESS else True
        # and the connection is still good
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlErr", 0, "a = 1"))
        assert bodies(reply) == ["x"]
        client.close()


async def test_property_filter_switched_off_refuses_sql92(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, remoting_enable_property_filter=False) as (_, addr):
        client = await RawRemoting.open(addr)
        await one_queue_topic(client, "SqlOff")
        await send(client, "SqlOff", "x", {"a": "1"})
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("SqlOff", 0, "a = 1"))
        assert reply.code == ResponseCode.SYSTEM_ERROR
        assert "does not support consumer to filter message by SQL92" in reply.remark
        body = json.dumps({"clientId": "c", "group": "g", "subscriptionData": {
            "topic": "SqlOff", "subString": "a = 1", "expressionType": "SQL92"}}).encode()
        reply = await client.call(RequestCode.CHECK_CLIENT_CONFIG, body=body)
        assert reply.code == ResponseCode.SYSTEM_ERROR
        tags = await client.call(RequestCode.PULL_MESSAGE, {**sql_pull("SqlOff", 0, "*"), "expressionType": "TAG"})
        assert bodies(tags) == ["x"]
        client.close()


async def test_mqtt_publishes_are_selected_by_their_remoting_properties(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, mqtt_bind="127.0.0.1:0") as (gw, addr):
        client = await RawRemoting.open(addr)
        await one_queue_topic(client, "Fleet")
        device = PahoClient(mqtt_port(gw), "truck-1", version=MQTT_5)
        await device.connect()
        await device.publish("Fleet/truck-1/temp", b"t1-temp", qos=1)
        await device.publish("Fleet/truck-1/gps", b"t1-gps", qos=0)
        await device.publish("Fleet/truck-2/temp", b"t2-temp", qos=1)
        await device.disconnect()
        selector = "mqttSecondTopic STARTSWITH '/truck-1/' AND qoslevel = 1"
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("Fleet", 0, selector))
        assert bodies(reply) == ["t1-temp"]
        reply = await client.call(RequestCode.PULL_MESSAGE, sql_pull("Fleet", 0, "mqttSecondTopic ENDSWITH '/temp'"))
        assert bodies(reply) == ["t1-temp", "t2-temp"]
        client.close()


def test_selectors_parse_each_expression_once_and_stay_bounded() -> None:
    selectors = Selectors(capacity=3, capacity_chars=40)
    first = selectors.get("a = 1", "SQL92")
    assert selectors.get("a = 1", "SQL92") is first  # (not parsed again)
    assert selectors.get("TagA || TagB", None).tag_codes == selectors.get("TagB||TagA", "TAG").tag_codes
    assert selectors.get("*", "TAG") is SELECT_ALL and selectors.get(None, "") is SELECT_ALL
    assert len(selectors) <= 3
    assert selectors.get("a = 1", "SQL92") is not first  # dropped, the least recently used
    selectors.get("b = '" + "x" * 30 + "'", "SQL92")
    assert len(selectors) == 1  # (the characters bound)
    with pytest.raises(BadRequest) as caught:
        selectors.get("a = '" + "x" * MAX_EXPRESSION_CHARS + "'", "SQL92")
    assert caught.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and "longer than" in str(caught.value)
