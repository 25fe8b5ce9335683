"""gRPC on the remoting port (``grpc_on_remoting_port``): the official client's Producer and
SimpleConsumer reach the gateway through the remoting port, whose routes then name that port,
while a remoting client on the same port is served as before; switched off, the port is
remoting only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from protocols.remoting.codes import RequestCode, ResponseCode
from tests.grpc_support import grpc_gateway, official_producer, official_simple_consumer, raw_stub
from tests.remoting_support import RawRemoting, pull_header, send_header
from tests.test_grpc import normal_message


async def test_official_clients_and_remoting_clients_share_the_remoting_port(data_dir: Path) -> None:
    async with grpc_gateway(data_dir) as (gw, _, remoting_addr):
        raw = await RawRemoting.open(remoting_addr)  # (a remoting connection open all along)
        async with raw_stub(remoting_addr) as stub:
            route = await stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="Shared")))
        assert route.status.code == pb.OK
        assert {f"{a.host}:{a.port}" for q in route.message_queues for a in q.broker.endpoints.addresses} \
            == {remoting_addr}  # (the client stays on the port it came to)
        async with official_producer(remoting_addr, "Shared") as producer:
            for i in range(3):
                await asyncio.to_thread(producer.send, normal_message("Shared", f"s{i}".encode()))
        sent = await raw.call(RequestCode.SEND_MESSAGE, send_header("Shared", queue_id=0), b"remoting")
        assert sent.code == ResponseCode.SUCCESS
        async with official_simple_consumer(remoting_addr, "GID-shared", "Shared") as consumer:
            got: list = []
            for _ in range(10):
                if len(got) >= 4:
                    break
                got.extend(await asyncio.to_thread(consumer.receive, 16, 30))
            assert sorted(m.body for m in got) == [b"remoting", b"s0", b"s1", b"s2"]
            for m in got:
                await asyncio.to_thread(consumer.ack, m)
        pulled = await raw.call(RequestCode.PULL_MESSAGE, pull_header("Shared", 0))
        assert pulled.code == ResponseCode.SUCCESS  # (the remoting side, on the same port, as before)
        raw.writer.close()


async def test_the_remoting_port_is_remoting_only_when_sharing_is_off(data_dir: Path) -> None:
    async with grpc_gateway(data_dir, grpc_on_remoting_port=False) as (gw, endpoint, remoting_addr):
        async with raw_stub(remoting_addr) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="Shared")), timeout=5)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        async with raw_stub(endpoint) as stub:  # (its own port still serves)
            route = await stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="Shared")))
        assert route.status.code == pb.OK


async def test_the_remoting_port_shares_over_ipv6_too(data_dir: Path) -> None:
    async with grpc_gateway(data_dir, remoting_bind="[::1]:0", grpc_bind="[::1]:0") as (gw, _, _):
        port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "remoting")
        async with raw_stub(f"[::1]:{port}") as stub:
            route = await stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="SharedV6")))
        assert route.status.code == pb.OK
        assert {(a.host, a.port) for q in route.message_queues for a in q.broker.endpoints.addresses} \
            == {("::1", port)}  # (known as forwarded: named by the port it came to)
        assert {q.broker.endpoints.scheme for q in route.message_queues} == {pb.IPv6}
