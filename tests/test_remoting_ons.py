"""The remoting gateway through ali-ons 3.12.0 (npm; pure JavaScript, as Egg.js apps use):
route lookup, send, push consumption with two consumers of one group (rebalance), offsets
across a restart, retry then DLQ, tag filter, delayed delivery and query by key."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.remoting_support import OnsProcess, ons, remoting_gateway


def messages(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "message"]


async def test_route_lookup_names_the_node_as_the_broker(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, remoting_default_queues=3) as (_, addr):
        events = await ons({"cmd": "route", "nameSrv": addr, "topic": "RouteTopic"})
        route = events[-1]["route"]
        assert route["queueDatas"][0]["readQueueNums"] == 3 and route["queueDatas"][0]["writeQueueNums"] == 3
        assert route["brokerDatas"][0]["brokerAddrs"]["0"] == addr


async def test_send_then_consume_with_tags_keys_and_properties(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        sent = await ons({"cmd": "send", "nameSrv": addr, "topic": "Orders", "messages": [
            {"tags": "TagA", "keys": ["order-1"], "body": "first", "properties": {"color": "red"}},
            {"tags": "TagB", "keys": ["order-2"], "body": "second"},
            {"tags": "TagA", "keys": ["order-3"], "body": "third"},
        ]})
        assert [e["sendStatus"] for e in sent] == ["SEND_OK"] * 3
        # a new group reads from the start of a queue whose first message is still stored
        events = await ons({"cmd": "consume", "nameSrv": addr, "group": "g-tags", "topic": "Orders",
                            "expression": "TagA", "count": 2, "timeoutMs": 20000})
        got = messages(events)
        assert sorted(m["body"] for m in got) == ["first", "third"]  # TagB filtered out
        first = next(m for m in got if m["body"] == "first")
        assert first["tags"] == "TagA" and first["keys"] == "order-1" and first["properties"]["color"] == "red"
        assert first["msgId"] == next(e["msgId"] for e in sent if int(e["queueId"]) == first["queueId"]
                                      and e["queueOffset"] == first["queueOffset"])


async def test_two_consumers_of_one_group_share_the_queues(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        spec = {"cmd": "consume", "nameSrv": addr, "group": "g-shared", "topic": "Shared", "count": 1000,
                "timeoutMs": 12000}
        first = await OnsProcess.start({**spec, "instance": "c1"})
        second = await OnsProcess.start({**spec, "instance": "c2"})
        try:
            await first.until("ready")
            await second.until("ready")
            await asyncio.sleep(3.0)  # both heartbeats in, each has rebalanced
            await ons({"cmd": "send", "nameSrv": addr, "topic": "Shared",
                       "messages": [{"body": f"m{i}"} for i in range(40)]})
            got = messages(await first.finish()) + messages(await second.finish())
        finally:
            first.kill()
            second.kill()
        assert sorted(m["body"] for m in got) == sorted(f"m{i}" for i in range(40))  # each once
        queues = {instance: {m["queueId"] for m in got if m["instance"] == instance} for instance in ("c1", "c2")}
        assert queues["c1"] and queues["c2"] and not queues["c1"] & queues["c2"]  # both got queues, none twice


async def test_consumed_offsets_survive_a_restart(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        await ons({"cmd": "send", "nameSrv": addr, "topic": "Durable",
                   "messages": [{"body": f"a{i}"} for i in range(8)]})
        events = await ons({"cmd": "consume", "nameSrv": addr, "group": "g-durable", "topic": "Durable",
                            "count": 8, "timeoutMs": 15000})
        assert len(messages(events)) == 8
    async with remoting_gateway(data_dir) as (_, addr):
        await ons({"cmd": "send", "nameSrv": addr, "topic": "Durable",
                   "messages": [{"body": f"b{i}"} for i in range(4)]})
        events = await ons({"cmd": "consume", "nameSrv": addr, "group": "g-durable", "topic": "Durable",
                            "count": 4, "timeoutMs": 15000, "lingerMs": 1500})
        assert sorted(m["body"] for m in messages(events)) == [f"b{i}" for i in range(4)]  # nothing again


async def test_retry_then_dead_letter_queue(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        # (flag 0x100 is one of the bits other protocols mark their records with: kept all the same)
        await ons({"cmd": "send", "nameSrv": addr, "topic": "Flaky", "messages": [{"body": "retry-me", "flag": 256}]})
        events = await ons({"cmd": "consume", "nameSrv": addr, "group": "g-retry", "topic": "Flaky",
                            "count": 1, "retryTimes": 2, "timeoutMs": 20000})
        got = messages(events)
        assert [m["body"] for m in got] == ["retry-me"] * 3
        assert [m["reconsumeTimes"] for m in got] == [0, 1, 2]  # redelivered from %RETRY%g-retry
        assert [m["flag"] for m in got] == [256] * 3
        # a consumer that always fails: after maxReconsumeTimes the message goes to %DLQ%
        await ons({"cmd": "send", "nameSrv": addr, "topic": "Flaky", "messages": [{"body": "poison"}]})
        await ons({"cmd": "consume", "nameSrv": addr, "group": "g-retry", "topic": "Flaky", "count": 1000,
                   "retryTimes": 1000, "maxReconsumeTimes": 2, "timeoutMs": 6000})
        dead = await ons({"cmd": "consume", "nameSrv": addr, "group": "g-dlq-reader", "topic": "%DLQ%g-retry",
                          "count": 1, "timeoutMs": 15000, "fromFirst": True})
        assert [m["body"] for m in messages(dead)] == ["poison"]


async def test_delayed_message_arrives_after_its_level(data_dir: Path) -> None:
    async with remoting_gateway(data_dir, remoting_delay_levels="1s 2s 3s") as (_, addr):
        consumer = await OnsProcess.start({"cmd": "consume", "nameSrv": addr, "group": "g-delay",
                                           "topic": "Later", "count": 1, "timeoutMs": 20000})
        try:
            await consumer.until("ready")
            await asyncio.sleep(2.0)
            await ons({"cmd": "send", "nameSrv": addr, "topic": "Later",
                       "messages": [{"body": "in two seconds", "delayLevel": 2}]})
            sent_at = asyncio.get_running_loop().time()
            message = await consumer.until("message", timeout=20)
            waited = asyncio.get_running_loop().time() - sent_at
        finally:
            consumer.kill()
        assert message["body"] == "in two seconds" and waited >= 1.8


async def test_query_by_key(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (_, addr):
        await ons({"cmd": "send", "nameSrv": addr, "topic": "Keyed", "messages": [
            {"body": "one", "keys": ["k-1", "shared"]}, {"body": "two", "keys": ["k-2", "shared"]}]})
        events = await ons({"cmd": "query", "nameSrv": addr, "topic": "Keyed", "key": "shared"})
        assert events[-1]["code"] == 0
        assert sorted(m["body"] for m in events[-1]["messages"]) == ["one", "two"]
        missing = await ons({"cmd": "query", "nameSrv": addr, "topic": "Keyed", "key": "nope"})
        assert missing[-1]["code"] == 22  # QUERY_NOT_FOUND
