"""Ordered messages: a sharding key (``__SHARDINGKEY``) picks the queue as RocketMQ's proxy does
(Guava's consistentHash of the key's Java hash); orderly consumers (librocketmq's, holding queue
locks) keep each key's order through a rebalance; a queue's lock has one holder per group."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from rocketmq import client as rmq

from gateway.remoting.ordering import consistent_hash, sharding_queue
from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.properties import encode_properties
from tests.remoting_support import RawRemoting, ons, remoting_gateway, send_header

KEYS = ("order-1", "order-2", "order-3", "order-4", "order-5")


def test_consistent_hash_gives_guavas_buckets() -> None:
    """Guava's own expectations for Hashing.consistentHash (its HashingTest's golden values)."""
    assert [consistent_hash(i, 100) for i in range(20)] == [0, 55, 62, 8, 45, 59, 86, 97, 82, 59, 73, 37, 17, 56,
                                                            86, 21, 90, 37, 38, 83]
    assert [consistent_hash(v, 11) for v in (10863919174838991, 2016238256797177309, 1673758223894951030)] == [6, 3, 5]
    assert [consistent_hash(v, 100001) for v in (2, 2201, 2202)] == [80343, 22152, 15018]
    assert all(consistent_hash(-v, 7) in range(7) for v in range(1, 500))  # negative Java hashes


async def test_a_sharding_key_picks_the_queue_whatever_queue_the_client_names(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        raw = await RawRemoting.open(addr)
        for i in range(8):
            for key in KEYS:
                props = encode_properties({"__SHARDINGKEY": key})
                response = await raw.call(RequestCode.SEND_MESSAGE, send_header("Ordered", i % 4, properties=props),
                                          f"{key}:{i}".encode())
                assert response.code == ResponseCode.SUCCESS
                assert int(response.ext_fields["queueId"]) == sharding_queue(key, 4)
        for key in KEYS:
            stored = [m.body.decode() for m in gw.store.get_now(f"r:Ordered:{sharding_queue(key, 4)}", 0, 100).messages]
            assert [b for b in stored if b.startswith(key + ":")] == [f"{key}:{i}" for i in range(8)]
        # a batch (the Java client's MessageBatch encoding) goes to one queue: one key for all, or none
        mixed = batch_body([(b"a", {"__SHARDINGKEY": "x"}), (b"b", {"__SHARDINGKEY": "y"})])
        response = await raw.call(RequestCode.SEND_BATCH_MESSAGE, send_header("Ordered", 0), mixed)
        assert response.code == ResponseCode.MESSAGE_ILLEGAL and "one sharding key" in response.remark
        same = batch_body([(b"a", {"__SHARDINGKEY": "x"}), (b"b", {"__SHARDINGKEY": "x"})])
        response = await raw.call(RequestCode.SEND_BATCH_MESSAGE, send_header("Ordered", 3), same)
        assert response.code == ResponseCode.SUCCESS and int(response.ext_fields["queueId"]) == sharding_queue("x", 4)
        raw.close()


def batch_body(items: list[tuple[bytes, dict[str, str]]]) -> bytes:
    """MessageDecoder.encodeMessages: per message total size, magic, body CRC, flag, body, properties."""
    out = b""
    for body, props in items:
        raw_props = encode_properties(props).encode()
        total = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(raw_props)
        out += struct.pack(">iiiii", total, 0, 0, 0, len(body)) + body + struct.pack(">h", len(raw_props)) + raw_props
    return out


class Orderly:
    """What orderly consumers saw: per key, each consumer's messages in the order consumed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, list[tuple[str, int]]] = defaultdict(list)  # key -> (consumer, i)

    def callback(self, consumer: str):
        def on_message(message: rmq.RecvMessage) -> None:
            key, i = message.body.decode().split(":")
            time.sleep(0.02)  # (slow enough that the rebalance comes while queues are being consumed)
            with self.lock:
                self.seen[key].append((consumer, int(i)))
        return on_message

    def distinct(self) -> int:
        with self.lock:
            return len({(key, i) for key, got in self.seen.items() for _, i in got})


@pytest.mark.usefixtures("rocketmq_home")
async def test_orderly_consumers_keep_each_keys_order_through_a_rebalance(data_dir: Path) -> None:
    per_key = 40
    async with remoting_gateway(data_dir) as (gw, addr):
        messages = [{"body": f"{key}:{i}", "properties": {"__SHARDINGKEY": key}} for i in range(per_key) for key in KEYS]
        events = await ons({"cmd": "send", "nameSrv": addr, "topic": "Ordered", "messages": messages})
        assert [e["event"] for e in events].count("sent") == len(messages)
        seen = Orderly()
        consumers = []

        async def start(name: str) -> None:
            consumer = rmq.PushConsumer("CID-orderly", orderly=True)
            consumer.set_namesrv_addr(addr)
            consumer.set_instance_name(name)
            consumer.subscribe("Ordered", seen.callback(name))
            await asyncio.to_thread(consumer.start)
            consumers.append(consumer)

        try:
            await start("a")
            deadline = time.monotonic() + 60
            while seen.distinct() < 40 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await start("b")  # a rebalance: queues move from a to b while a consumes
            while seen.distinct() < len(messages) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert seen.distinct() == len(messages)
        finally:
            for consumer in consumers:
                await asyncio.to_thread(consumer.shutdown)
        for key, got in seen.seen.items():
            for consumer in ("a", "b"):  # each consumer saw the key's messages in order
                numbers = [i for c, i in got if c == consumer]
                assert numbers == sorted(numbers), (key, consumer, numbers)
            firsts = list(dict.fromkeys(i for _, i in got))
            assert firsts == sorted(firsts), (key, firsts)  # (a redelivery after the move comes first, in order)
        # (Not asserted: that no queue's callbacks overlap. librocketmq unlocks a queue it loses in
        # a rebalance at once, while its callback for that queue may still run -- measured: UNLOCK
        # 5 ms into a 20 ms callback, the new holder's LOCK 1 ms later -- where the Java client
        # waits for its consume lock (RebalancePushImpl.removeUnnecessaryMessageQueue). The
        # broker hands a lock over only after its holder's unlock or expiry, as RocketMQ's:
        # test_queue_locks_keep_one_holder_per_group_queue.)
        assert {c for got in seen.seen.values() for c, _ in got} == {"a", "b"}


async def test_queue_locks_keep_one_holder_per_group_queue(data_dir: Path) -> None:
    async with remoting_gateway(data_dir) as (gw, addr):
        raw = await RawRemoting.open(addr)

        async def lock(client: str, group: str = "G") -> list[int]:
            body = {"consumerGroup": group, "clientId": client,
                    "mqSet": [{"topic": "Ordered", "brokerName": "tidemq", "queueId": q} for q in range(2)]}
            response = await raw.call(RequestCode.LOCK_BATCH_MQ, {}, json.dumps(body).encode())
            return sorted(mq["queueId"] for mq in json.loads(response.body)["lockOKMQSet"])

        assert await lock("a") == [0, 1]
        assert await lock("b") == []  # held by a
        assert await lock("b", group="H") == [0, 1]  # another group's locks are its own
        assert await lock("a") == [0, 1]  # renewed
        unlock = {"consumerGroup": "G", "clientId": "a", "mqSet": [{"topic": "Ordered", "brokerName": "tidemq",
                                                                    "queueId": 0}]}
        assert (await raw.call(RequestCode.UNLOCK_BATCH_MQ, {}, json.dumps(unlock).encode())).code == 0
        assert await lock("b") == [0]
        raw.close()
