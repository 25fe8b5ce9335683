"""gRPC over TLS (``grpcs_bind``, with MQTT's ``tls_cert_file`` and ``tls_key_file``): the
official client, trusting only a test CA, verifies the gateway's certificate and sends and
receives, on the TLS port and through the remoting port; a client that does not trust the CA
is refused the connection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceStub
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import SimpleConsumer
from rocketmq.v5.model import FilterExpression
from rocketmq.v5.producer import Producer

from gateway.config import ConfigError, load_config
from tests.grpc_support import grpc_gateway, started
from tests.test_grpc import normal_message


async def test_the_official_client_verifies_the_gateway_over_tls(data_dir: Path, pki: dict[str, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # (the official client's channels trust grpcio's default roots: here the test CA only)
    monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(pki["ca"]))
    async with grpc_gateway(data_dir, grpcs_bind="127.0.0.1:0", tls_cert_file=str(pki["cert"]),
                            tls_key_file=str(pki["key"])) as (gw, _, remoting_addr):
        assert gw.grpc is not None
        tls_endpoint = f"127.0.0.1:{gw.grpc.tls_address[1]}"
        for endpoint in (tls_endpoint, remoting_addr):  # (the remoting port forwards TLS too)
            configuration = ClientConfiguration(endpoint, Credentials(), request_timeout=10)
            async with started(Producer(configuration, ("Secure",), None, tls_enable=True)) as producer:
                await asyncio.to_thread(producer.send, normal_message("Secure", f"via {endpoint}".encode()))
            async with started(SimpleConsumer(configuration, "GID-secure", {"Secure": FilterExpression("*")},
                                              await_duration=2, tls_enable=True)) as consumer:
                [got] = await asyncio.to_thread(consumer.receive, 4, 30)
                assert got.body == f"via {endpoint}".encode()
                await asyncio.to_thread(consumer.ack, got)

        trusted = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
        async with grpc.aio.secure_channel(tls_endpoint, trusted) as channel:
            route = await MessagingServiceStub(channel).QueryRoute(rpc.QueryRouteRequest(
                topic=pb.Resource(name="Secure")))
        assert {a.port for q in route.message_queues for a in q.broker.endpoints.addresses} \
            == {gw.grpc.tls_address[1]}  # (routes over TLS name the TLS port)

        untrusted = grpc.ssl_channel_credentials(root_certificates=pki["other_ca"].read_bytes())
        async with grpc.aio.secure_channel(tls_endpoint, untrusted) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await MessagingServiceStub(channel).QueryRoute(rpc.QueryRouteRequest(
                    topic=pb.Resource(name="Secure")), timeout=5)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE


def test_grpcs_bind_needs_a_certificate_and_key() -> None:
    with pytest.raises(ConfigError, match="grpcs_bind needs tls_cert_file and tls_key_file"):
        load_config(env={}, overrides={"grpcs_bind": "127.0.0.1:0"})
    with pytest.raises(ConfigError, match="grpcs_bind needs remoting_bind"):
        load_config(env={}, overrides={"grpcs_bind": "127.0.0.1:0", "remoting_bind": "", "tls_cert_file": "c.pem",
                                       "tls_key_file": "k.pem"})
