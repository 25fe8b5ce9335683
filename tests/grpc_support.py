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
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import SimpleConsumer
from rocketmq.v5.model import FilterExpression
from rocketmq.v5.producer import Producer

from gateway.server import Gateway
from tests.remoting_support import remoting_gateway


def grpc_port(gw: Gateway) -> int:
    assert gw.grpc is not None
    return gw.grpc.address[1]


@contextlib.asynccontextmanager
async def grpc_gateway(data_dir: Path, **config: Any) -> AsyncIterator[tuple[Gateway, str, str]]:
    """A gateway with gRPC on; yields it, the gRPC endpoint and the remoting address."""
    async with remoting_gateway(data_dir, grpc_bind="127.0.0.1:0", **config) as (gw, remoting_addr):
        yield gw, f"127.0.0.1:{grpc_port(gw)}", remoting_addr


@contextlib.asynccontextmanager
async def official_producer(endpoint: str, *topics: str) -> AsyncIterator[Producer]:
    """The official client's Producer, started (route, telemetry settings) and shut down."""
    producer = Producer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), topics)
    await asyncio.to_thread(producer.startup)
    try:
        yield producer
    finally:
        await asyncio.to_thread(producer.shutdown)


@contextlib.asynccontextmanager
async def official_simple_consumer(endpoint: str, group: str, topic: str, expression: str = "*", *,
                                   await_s: int = 2) -> AsyncIterator[SimpleConsumer]:
    """The official client's SimpleConsumer of ``topic`` (a TAG expression), long-polling
    ``await_s`` seconds per receive, started and shut down."""
    consumer = SimpleConsumer(ClientConfiguration(endpoint, Credentials(), request_timeout=10), group,
                              {topic: FilterExpression(expression)}, await_duration=await_s)
    await asyncio.to_thread(consumer.startup)
    try:
        yield consumer
    finally:
        await asyncio.to_thread(consumer.shutdown)


@contextlib.asynccontextmanager
async def raw_stub(endpoint: str) -> AsyncIterator[MessagingServiceStub]:
    """grpcio's stub of ``MessagingService`` on one channel."""
    async with grpc.aio.insecure_channel(endpoint) as channel:
        yield MessagingServiceStub(channel)
