"""Test helpers for RocketMQ 5 clients over gRPC: a real gateway with its remoting and gRPC
listeners on ephemeral ports, the official Python client (PyPI ``rocketmq-python-client``,
blocking: driven from threads) and grpcio stubs of ``MessagingService`` for what the client
checks before sending."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import MessageListener, PushConsumer, SimpleConsumer
from rocketmq.v5.model import FilterExpression
from rocketmq.v5.producer import Producer, TransactionChecker

from gateway.server import Gateway
from tests.remoting_support import remoting_gateway


def grpc_port(gw: Gateway) -> int:
    assert gw.grpc is not None
    return gw.grpc.address[1]


@contextlib.asynccontextmanager
async def grpc_gateway(data_dir: Path, **config: Any) -> AsyncIterator[tuple[Gateway, str, str]]:
    """A gateway with gRPC on; yields it, the gRPC endpoint and the remoting address."""
    config.setdefault("grpc_bind", "127.0.0.1:0")
    async with remoting_gateway(data_dir, **config) as (gw, remoting_addr):
        yield gw, f"127.0.0.1:{grpc_port(gw)}", remoting_addr


@contextlib.asynccontextmanager
async def started(client: Any) -> AsyncIterator[Any]:
    """One of the official client's producers or consumers, started and shut down."""
    await asyncio.to_thread(client.startup)
    try:
        yield client
    finally:
        await asyncio.to_thread(client.shutdown)


def official_producer(endpoint: str, *topics: str, credentials: Credentials | None = None,
                      checker: TransactionChecker | None = None) -> contextlib.AbstractAsyncContextManager[Producer]:
    """The official client's Producer (signing with ``credentials``: an AccessKey and its
    SecretKey; answering transaction checks with ``checker``), started (route, telemetry
    settings) and shut down."""
    return started(Producer(ClientConfiguration(endpoint, credentials or Credentials(), request_timeout=10), topics,
                            checker))


def official_simple_consumer(endpoint: str, group: str, topic: str, expression: str = "*", *,
                             await_s: int = 2, credentials: Credentials | None = None
                             ) -> contextlib.AbstractAsyncContextManager[SimpleConsumer]:
    """The official client's SimpleConsumer of ``topic`` (a TAG expression), long-polling
    ``await_s`` seconds per receive, started and shut down."""
    return started(SimpleConsumer(ClientConfiguration(endpoint, credentials or Credentials(), request_timeout=10),
                                  group,
                                  {topic: FilterExpression(expression)}, await_duration=await_s))


def official_push_consumer(endpoint: str, group: str, topic: str, listener: MessageListener, expression: str = "*"
                           ) -> contextlib.AbstractAsyncContextManager[PushConsumer]:
    """The official client's PushConsumer of ``topic`` (a TAG expression), calling ``listener``
    from its threads, started and shut down."""
    return started(PushConsumer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), group, listener,
                                {topic: FilterExpression(expression)}))


@contextlib.asynccontextmanager
async def raw_stub(endpoint: str) -> AsyncIterator[MessagingServiceStub]:
    """grpcio's stub of ``MessagingService`` on one channel."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        yield MessagingServiceStub(channel)


async def raw_receive_and_ack(stub: MessagingServiceStub, group: str, topic: str, *, batch: int = 32,
                              poll_s: int = 2, invisible_s: int = 60) -> list[pb.Message]:
    """One ``ReceiveMessage`` of up to ``batch`` messages of ``topic`` for ``group`` (long-polling
    ``poll_s``), each then acknowledged with its receipt handle; the messages received."""
    got = [answer.message async for answer in stub.ReceiveMessage(rpc.ReceiveMessageRequest(
        group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=batch,
        invisible_duration=Duration(seconds=invisible_s), long_polling_timeout=Duration(seconds=poll_s)))
        if answer.HasField("message")]
    if got:
        acked = await stub.AckMessage(rpc.AckMessageRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic),
            entries=[rpc.AckMessageEntry(message_id=m.system_properties.message_id,
                                         receipt_handle=m.system_properties.receipt_handle) for m in got]))
        assert acked.status.code == pb.OK, acked.status
    return got
