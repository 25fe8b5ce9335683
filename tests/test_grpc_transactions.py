"""Transactional messages of RocketMQ 5 clients over gRPC, through the official Producer with a
TransactionChecker: a half message is held until its transaction ends -- commit delivers it
(to gRPC and remoting consumers alike), rollback never; one left open is checked through the
producer's Telemetry stream (RecoverOrphanedTransactionCommand), whose checker's answer ends
it; an end naming no waiting half message is INVALID_TRANSACTION_ID."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.v5.model import Message
from rocketmq.v5.producer import TransactionChecker

from store import HALF
from tests.grpc_support import grpc_gateway, official_producer, official_simple_consumer, raw_stub
from tests.test_grpc import normal_message, receive_all
from tests.test_grpc_access import ALICE, signed
from tests.test_remoting_access import secured  # noqa: F401 (a fixture)

QUICK_CHECKS = {"remoting_transaction_timeout_s": 1.0, "remoting_transaction_check_interval_s": 1.0}


class Checker(TransactionChecker):
    """Commits the half messages whose body starts with ``commit``, rolls back the rest; counts them."""

    def __init__(self) -> None:
        self.checked: list[bytes] = []

    def check(self, message: Message) -> int:
        self.checked.append(message.body)
        return pb.COMMIT if message.body.startswith(b"commit") else pb.ROLLBACK


async def test_a_committed_transaction_is_delivered_and_a_rolled_back_one_never(data_dir: Path) -> None:
    checker = Checker()
    async with grpc_gateway(data_dir, remoting_transaction_timeout_s=60.0) as (_, endpoint, _):
        async with official_producer(endpoint, "GrpcTx", checker=checker) as producer, \
                official_simple_consumer(endpoint, "GID-tx", "GrpcTx") as consumer:
            kept, dropped = producer.begin_transaction(), producer.begin_transaction()
            sent = await asyncio.to_thread(producer.send, normal_message("GrpcTx", b"kept", tag="t"), kept)
            await asyncio.to_thread(producer.send, normal_message("GrpcTx", b"dropped"), dropped)
            assert sent.transaction_id
            assert await asyncio.to_thread(consumer.receive, 16, 30) == []  # (held until the end)
            await asyncio.to_thread(kept.commit)
            await asyncio.to_thread(dropped.rollback)
            got = await receive_all(consumer, 1)
            assert [(m.body, m.message_id, m.tag) for m in got] == [(b"kept", sent.message_id, "t")]
            await asyncio.to_thread(consumer.ack, got[0])
            assert await asyncio.to_thread(consumer.receive, 16, 30) == []  # the rolled back one: never
            async with raw_stub(endpoint) as stub:
                again = await stub.EndTransaction(rpc.EndTransactionRequest(
                    topic=pb.Resource(name="GrpcTx"), message_id=sent.message_id, transaction_id=sent.transaction_id,
                    resolution=pb.COMMIT))
                bogus = await stub.EndTransaction(rpc.EndTransactionRequest(
                    topic=pb.Resource(name="GrpcTx"), message_id=sent.message_id, transaction_id="x1 12345",
                    resolution=pb.COMMIT))
                foreign = await stub.EndTransaction(rpc.EndTransactionRequest(
                    topic=pb.Resource(name="GrpcTx"), message_id=sent.message_id, transaction_id="not ours",
                    resolution=pb.ROLLBACK))
        assert [r.status.code for r in (again, bogus, foreign)] == [pb.INVALID_TRANSACTION_ID] * 3
        assert checker.checked == []  # (both ended before their check was due)


async def test_an_open_transaction_is_checked_through_the_producers_telemetry(data_dir: Path) -> None:
    checker = Checker()
    async with grpc_gateway(data_dir, **QUICK_CHECKS) as (gw, endpoint, _):
        async with official_producer(endpoint, "GrpcTxCheck", checker=checker) as producer:
            for body in (b"commit me", b"roll me back"):
                await asyncio.to_thread(producer.send, normal_message("GrpcTxCheck", body),
                                        producer.begin_transaction())
            # (no end from the producer: the gateway asks it, its checker answers)
            async with official_simple_consumer(endpoint, "GID-txcheck", "GrpcTxCheck") as consumer:
                got = await receive_all(consumer, 1)
                assert [m.body for m in got] == [b"commit me"]
                await asyncio.to_thread(consumer.ack, got[0])
                for _ in range(20):  # until the other one's check was answered too
                    if len(checker.checked) >= 2 and not gw.store.held.due(HALF, 1 << 62, 10):
                        break
                    await asyncio.sleep(0.25)
                assert await asyncio.to_thread(consumer.receive, 16, 30) == []
        assert sorted(checker.checked[:2]) == [b"commit me", b"roll me back"]


async def test_only_a_producer_that_may_write_the_topic_ends_its_transaction(data_dir: Path, secured: dict) -> None:
    async with grpc_gateway(data_dir, remoting_transaction_timeout_s=60.0, **secured) as (_, endpoint, _):
        async with official_producer(endpoint, "secret", credentials=ALICE, checker=Checker()) as producer:
            sent = await asyncio.to_thread(producer.send, normal_message("secret", b"alice's"),
                                           producer.begin_transaction())
        end = rpc.EndTransactionRequest(topic=pb.Resource(name="secret"), message_id=sent.message_id,
                                        transaction_id=sent.transaction_id, resolution=pb.COMMIT)
        async with raw_stub(endpoint) as stub:
            denied = await stub.EndTransaction(end, metadata=signed("mallory"))
            ended = await stub.EndTransaction(end, metadata=signed("alice"))
        assert (denied.status.code, ended.status.code) == (pb.FORBIDDEN, pb.OK)
