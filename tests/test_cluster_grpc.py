"""RocketMQ 5 clients on a gateway node (``role = "gateway"`` with ``grpc_bind`` or
``grpcs_bind``, and on its remoting port), in one process with its store node: the official
Python client's Producer and SimpleConsumer connected to the gateway node only; routes and
assignments name the gateway node's endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from rocketmq.v5.client import Credentials
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.client import ClientConfiguration
from rocketmq.v5.consumer import SimpleConsumer
from rocketmq.v5.model import FilterExpression
from rocketmq.v5.producer import Producer

from gateway.config import Config, ConfigError
from gateway.server import Gateway

from .grpc_support import grpc_port, official_producer, official_simple_consumer, raw_stub, started
from .test_grpc import normal_message, receive_all
from .test_grpc_access import ALICE, signed
from .test_remoting_access import KEYS, secured  # noqa: F401 (secured: a fixture)
from .test_store_link import remoting_port


@asynccontextmanager
async def store_and_node(data_dir: Path, **store_options: Any) -> AsyncIterator[tuple[Gateway, str]]:
    """A store node with its gRPC listener, and a gateway node's gRPC endpoint in front of it."""
    store = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0",
                           grpc_bind="127.0.0.1:0", **store_options))
    await store.start()
    node = Gateway(Config(data_dir=data_dir / "unused", role="gateway", node_id="g", mqtt_bind="", amqp_bind="",
                          grpc_bind="127.0.0.1:0", store_address=f"127.0.0.1:{remoting_port(store)}",
                          cluster_token=store_options.get("cluster_token", "")))
    try:
        await node.start()
        proxy = node.relayed.grpc_proxy if node.relayed is not None else None
        assert proxy is not None and proxy.server is not None
        yield store, f"127.0.0.1:{proxy.endpoints.addresses[0].port}"
    finally:
        await node.stop()
        await store.stop()


async def test_official_client_sends_and_receives_through_the_gateway_node(data_dir: Path) -> None:
    async with store_and_node(data_dir) as (store, endpoint):
        host, port = endpoint.split(":")
        assert int(port) != grpc_port(store)
        async with raw_stub(endpoint) as stub:
            route = await stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="NodeJobs")), timeout=10)
            assert route.status.code == pb.OK
            assert {(a.host, a.port) for q in route.message_queues for a in q.broker.endpoints.addresses} == \
                {(host, int(port))}
        async with official_producer(endpoint, "NodeJobs") as producer:
            for i in range(5):
                await asyncio.to_thread(producer.send, normal_message("NodeJobs", b"job-%d" % i))
        async with official_simple_consumer(endpoint, "GID-node", "NodeJobs") as consumer:
            got = await receive_all(consumer, 5)
            assert sorted(m.body for m in got) == [b"job-%d" % i for i in range(5)]
            for message in got:
                await asyncio.to_thread(consumer.ack, message)
        async with raw_stub(endpoint) as stub:  # (the store node's answer, whatever it is, is passed on)
            try:
                assignment = await stub.QueryAssignment(rpc.QueryAssignmentRequest(
                    topic=pb.Resource(name="NodeJobs"), group=pb.Resource(name="GID-node"),
                    endpoints=route.message_queues[0].broker.endpoints), timeout=10)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNIMPLEMENTED  # (not built on the store node yet)
            else:
                assert assignment.status.code == pb.OK
                assert {(a.host, a.port) for x in assignment.assignments
                        for a in x.message_queue.broker.endpoints.addresses} == {(host, int(port))}
        assert store.remoting is not None and "NodeJobs" in store.remoting.topics.topics  # on the store node


async def test_signed_calls_are_checked_by_the_store_node_through_the_gateway_node(
        data_dir: Path, secured: dict) -> None:
    """The official client's AccessKey signature (call metadata) reaches the store node as it
    was made: served for the right secret, refused for a wrong one, the ACL's denials kept."""
    async with store_and_node(data_dir, cluster_token="T", **secured) as (store, endpoint):
        async with official_producer(endpoint, "NodeSigned", credentials=ALICE) as producer:
            await asyncio.to_thread(producer.send, normal_message("NodeSigned", b"signed"))
        async with official_simple_consumer(endpoint, "GID-node-signed", "NodeSigned", credentials=ALICE) as consumer:
            assert [m.body for m in await receive_all(consumer, 1)] == [b"signed"]
        async with official_producer(endpoint, "NodeSigned",
                                     credentials=Credentials(KEYS["alice"][0], "not-the-secret")) as producer:
            with pytest.raises(Exception, match="route"):  # (the client's words for UNAUTHORIZED)
                await asyncio.to_thread(producer.send, normal_message("NodeSigned", b"refused"))
        assert store.remoting is not None and store.remoting.stats.auth_failures > 0
        async with raw_stub(endpoint) as stub:  # (the official client says FORBIDDEN as "failed to fetch ... route")
            denied = await stub.QueryRoute(rpc.QueryRouteRequest(topic=pb.Resource(name="secret")),
                                           metadata=signed("mallory"), timeout=10)
            assert denied.status.code == pb.FORBIDDEN


async def test_a_gateway_node_refuses_grpc_when_its_store_node_has_no_grpc_listener(data_dir: Path) -> None:
    store = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0"))
    await store.start()
    node = Gateway(Config(data_dir=data_dir / "unused", role="gateway", node_id="g", mqtt_bind="", amqp_bind="",
                          grpc_bind="127.0.0.1:0", store_address=f"127.0.0.1:{remoting_port(store)}"))
    try:
        with pytest.raises(ConfigError, match="no gRPC listener"):
            await node.start()
    finally:
        await node.stop()
        await store.stop()


async def test_a_gateway_node_serves_grpc_over_tls_and_on_its_remoting_port(
        data_dir: Path, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway node with ``grpc_bind``, ``grpcs_bind`` and its remoting relay: the official client, trusting
    only the test CA, sends and receives over TLS on the node's TLS port and on its remoting
    port, and in plain gRPC on the remoting port; each route names the node's port the call
    came to. The node goes on to the store node in plain gRPC."""
    monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(pki["ca"]))
    store = Gateway(Config(data_dir=data_dir, role="store", mqtt_bind="", amqp_bind="", remoting_bind="127.0.0.1:0",
                           grpc_bind="127.0.0.1:0"))
    await store.start()
    node = Gateway(Config(data_dir=data_dir / "unused", role="gateway", node_id="g", mqtt_bind="", amqp_bind="",
                          remoting_bind="127.0.0.1:0", grpc_bind="127.0.0.1:0", grpcs_bind="127.0.0.1:0",
                          tls_cert_file=str(pki["cert"]),
                          tls_key_file=str(pki["key"]), store_address=f"127.0.0.1:{remoting_port(store)}"))
    try:
        await node.start()
        assert node.relayed is not None and node.relayed.grpc_proxy is not None and node.relayed.remoting is not None
        tls_port = node.relayed.grpc_proxy.tls_endpoints.addresses[0].port
        node_remoting = node.relayed.remoting.advertised
        for endpoint, tls in ((f"127.0.0.1:{tls_port}", True), (node_remoting, True), (node_remoting, False)):
            configuration = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
            body = f"via {endpoint} tls={tls}".encode()
            async with started(Producer(configuration, ("NodeSecure",), None, tls_enable=tls)) as producer:
                await asyncio.to_thread(producer.send, normal_message("NodeSecure", body))
            async with started(SimpleConsumer(configuration, "GID-node-secure", {"NodeSecure": FilterExpression("*")},
                                              await_duration=2, tls_enable=tls)) as consumer:
                [got] = await asyncio.to_thread(consumer.receive, 4, 30)
                assert got.body == body
                await asyncio.to_thread(consumer.ack, got)
            credentials = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
            async with (grpc.aio.secure_channel(endpoint, credentials) if tls
                        else grpc.aio.insecure_channel(endpoint)) as channel:
                route = await MessagingServiceStub(channel).QueryRoute(rpc.QueryRouteRequest(
                    topic=pb.Resource(name="NodeSecure")), timeout=10)
            assert {f"{a.host}:{a.port}" for q in route.message_queues for a in q.broker.endpoints.addresses} \
                == {endpoint}
    finally:
        await node.stop()
        await store.stop()
