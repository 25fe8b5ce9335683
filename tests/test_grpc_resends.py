"""A SendMessage sent again -- the official clients' retry after a lost answer keeps the message
id -- is answered as the first time (the same message id, offset and transaction id) and stored
once: on a store node's own gRPC listener and through a gateway node's proxy."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from .grpc_support import grpc_gateway, official_simple_consumer, raw_stub
from .test_cluster_grpc import store_and_node
from .test_grpc import receive_all


def send_request(topic: str, body: bytes, message_id: str, kind: int = pb.NORMAL) -> rpc.SendMessageRequest:
    message = pb.Message(topic=pb.Resource(name=topic), body=body)
    message.system_properties.message_id = message_id
    message.system_properties.message_type = kind
    message.system_properties.body_encoding = pb.IDENTITY
    if kind == pb.DELAY:
        message.system_properties.delivery_timestamp.CopyFrom(Timestamp(seconds=4_000_000_000))
    if kind == pb.FIFO:  # (one queue: its offsets count the messages stored)
        message.system_properties.message_group = "one"
    return rpc.SendMessageRequest(messages=[message])


def client(name: str) -> list[tuple[str, str]]:
    return [("x-mq-client-id", name)]


@asynccontextmanager
async def direct(data_dir: Path) -> AsyncIterator[str]:
    async with grpc_gateway(data_dir) as (_, endpoint, _):
        yield endpoint


@asynccontextmanager
async def proxied(data_dir: Path) -> AsyncIterator[str]:
    async with store_and_node(data_dir) as (_, endpoint):
        yield endpoint


async def sent_again_is_answered_as_the_first_time(endpoint: str) -> None:
    async with raw_stub(endpoint) as stub:
        answers = []
        for message_id, body in (("01A", b"once"), ("01A", b"once"), ("01B", b"other"), ("01A", b"once")):
            answer = await stub.SendMessage(send_request("Resent", body, message_id, pb.FIFO),
                                            metadata=client("c1"), timeout=10)
            assert answer.status.code == pb.OK, answer.status
            answers.append(answer.entries[0])
        assert [(a.message_id, a.offset) for a in answers] == [("01A", 0), ("01A", 0), ("01B", 1), ("01A", 0)]
        held = [await stub.SendMessage(send_request("Resent", b"half", "01T", pb.TRANSACTION), metadata=client("c1"),
                                       timeout=10) for _ in range(2)]
        assert held[0].entries[0].transaction_id == held[1].entries[0].transaction_id  # (its end names it by it)
        ended = await stub.EndTransaction(rpc.EndTransactionRequest(
            topic=pb.Resource(name="Resent"), message_id="01T", transaction_id=held[1].entries[0].transaction_id,
            resolution=pb.COMMIT), metadata=client("c1"), timeout=10)
        assert ended.status.code == pb.OK, ended.status
    async with official_simple_consumer(endpoint, "GID-resent", "Resent") as consumer:
        got = await receive_all(consumer, 3)
        got += await asyncio.to_thread(consumer.receive, 16, 30)  # (nothing more)
        assert Counter(m.message_id for m in got) == {"01A": 1, "01B": 1, "01T": 1}


async def test_a_send_sent_again_is_stored_once_on_a_store_node(data_dir: Path) -> None:
    async with direct(data_dir) as endpoint:
        await sent_again_is_answered_as_the_first_time(endpoint)


async def test_a_send_sent_again_is_stored_once_through_a_gateway_node(data_dir: Path) -> None:
    async with proxied(data_dir) as endpoint:
        await sent_again_is_answered_as_the_first_time(endpoint)
