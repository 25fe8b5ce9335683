"""RocketMQ 5 clients over gRPC under the access keys and ACL the remoting side uses: the
official client signs its calls (the ``authorization`` metadata) and is let in; a wrong
SecretKey, an unsigned call or a malformed signature is UNAUTHORIZED; an AccessKey whose user
the ACL denies a topic is FORBIDDEN to send there or receive from it, and no message of a
denied topic reaches it."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from pathlib import Path

import pytest
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.v5.client import Credentials
from rocketmq.v5.exception import ForbiddenException

from tests.grpc_support import grpc_gateway, official_producer, official_simple_consumer, raw_stub
from tests.test_grpc import normal_message, receive_all
from tests.test_remoting_access import KEYS, secured  # noqa: F401 (secured: a fixture)

ALICE = Credentials(*KEYS["alice"])  # may read and write everything
MALLORY = Credentials(*KEYS["mallory"])  # denied secret/# and devices/+/cmd


def signed(user: str, secret: str | None = None, when: str = "20261129T120000Z") -> list[tuple[str, str]]:
    """A call's metadata signed as RocketMQ 5's clients sign, written from its definition:
    HmacSHA1 of the x-mq-date-time value with the SecretKey, hex."""
    access_key, secret_key = KEYS[user]
    digest = hmac.new((secret or secret_key).encode(), when.encode(), hashlib.sha1).hexdigest()
    return [("x-mq-date-time", when), ("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, "
                                                       f"SignedHeaders=x-mq-date-time, Signature={digest}")]


def route(topic: str) -> rpc.QueryRouteRequest:
    return rpc.QueryRouteRequest(topic=pb.Resource(name=topic))


async def test_signed_calls_are_served_and_bad_signatures_are_unauthorized(data_dir: Path, secured: dict) -> None:
    async with grpc_gateway(data_dir, **secured) as (gw, endpoint, _):
        async with official_producer(endpoint, "GrpcSigned", credentials=ALICE) as producer:
            sent = await asyncio.to_thread(producer.send, normal_message("GrpcSigned", b"signed"))
        async with official_simple_consumer(endpoint, "GID-signed", "GrpcSigned", credentials=ALICE) as consumer:
            got = await receive_all(consumer, 1)
            assert [(m.body, m.message_id) for m in got] == [(b"signed", sent.message_id)]
            await asyncio.to_thread(consumer.ack, got[0])
        assert gw.remoting is not None and gw.remoting.stats.auth_failures == 0  # (its telemetry streams too)
        for credentials in (Credentials(KEYS["alice"][0], "not-the-secret"), Credentials()):
            async with official_producer(endpoint, "GrpcSigned", credentials=credentials) as producer:
                with pytest.raises(Exception, match="route"):  # (the client's words for UNAUTHORIZED: below)
                    await asyncio.to_thread(producer.send, normal_message("GrpcSigned", b"refused"))
        async with raw_stub(endpoint) as stub:
            good = await stub.QueryRoute(route("GrpcSigned"), metadata=signed("alice"))
            wrong = await stub.QueryRoute(route("GrpcSigned"), metadata=signed("alice", "not-the-secret"))
            unsigned = await stub.QueryRoute(route("GrpcSigned"))
            unknown = await stub.QueryRoute(route("GrpcSigned"), metadata=[
                ("x-mq-date-time", "20261129T120000Z"),
                ("authorization", "MQv2-HMAC-SHA1 Credential=AK-nobody, SignedHeaders=x-mq-date-time, Signature=00")])
            malformed = await stub.QueryRoute(route("GrpcSigned"), metadata=[("authorization", "Basic YWxpY2U6cHc=")])
            undated = await stub.QueryRoute(route("GrpcSigned"), metadata=signed("alice")[1:])
            send = await stub.SendMessage(rpc.SendMessageRequest(messages=[_raw("GrpcSigned")]),
                                          metadata=signed("alice", "not-the-secret"))
            beat = await stub.Heartbeat(rpc.HeartbeatRequest(client_type=pb.PRODUCER))
            telemetry = [c async for c in stub.Telemetry(iter([rpc.TelemetryCommand(settings=pb.Settings())]))]
        assert good.status.code == pb.OK
        assert [r.status.code for r in (wrong, unsigned, unknown, malformed, undated, send, beat)] == [
            pb.UNAUTHORIZED] * 7
        assert "SecretKey" in wrong.status.message and not wrong.message_queues
        assert [c.status.code for c in telemetry] == [pb.UNAUTHORIZED]
        assert gw.remoting is not None and gw.remoting.stats.auth_failures >= 9


def _raw(topic: str) -> pb.Message:
    message = pb.Message(topic=pb.Resource(name=topic), body=b"x")
    message.system_properties.message_id = "01AABBCCDDEEFF00112233445566"
    message.system_properties.message_type = pb.NORMAL
    return message


async def test_a_key_denied_a_topic_is_forbidden_and_gets_none_of_its_messages(data_dir: Path, secured: dict
                                                                              ) -> None:
    async with grpc_gateway(data_dir, **secured) as (_, endpoint, _):
        async with official_producer(endpoint, "secret", "devices", credentials=ALICE) as producer:
            await asyncio.to_thread(producer.send, normal_message("secret", b"for alice"))
            for second in ("/d1/cmd", "/d1/temp"):
                await asyncio.to_thread(producer.send, normal_message("devices", second.encode(),
                                                                      mqttSecondTopic=second))
        async with official_producer(endpoint, "devices", credentials=MALLORY) as producer:
            with pytest.raises(ForbiddenException):
                await asyncio.to_thread(producer.send, normal_message("devices", b"cmd", mqttSecondTopic="/d2/cmd"))
            await asyncio.to_thread(producer.send, normal_message("devices", b"/d2/temp", mqttSecondTopic="/d2/temp"))
        async with raw_stub(endpoint) as stub:
            send = await stub.SendMessage(rpc.SendMessageRequest(messages=[_raw("secret")]),
                                          metadata=signed("mallory"))
            receive = [r async for r in stub.ReceiveMessage(rpc.ReceiveMessageRequest(
                group=pb.Resource(name="GID-mallory"), message_queue=pb.MessageQueue(topic=pb.Resource(name="secret")),
                batch_size=4, invisible_duration=Duration(seconds=30)), metadata=signed("mallory"))]
            ack = await stub.AckMessage(rpc.AckMessageRequest(
                group=pb.Resource(name="GID-mallory"), topic=pb.Resource(name="secret"),
                entries=[rpc.AckMessageEntry(message_id="x", receipt_handle="t1 0 0 1")]), metadata=signed("mallory"))
            change = await stub.ChangeInvisibleDuration(rpc.ChangeInvisibleDurationRequest(
                group=pb.Resource(name="GID-mallory"), topic=pb.Resource(name="secret"), receipt_handle="t1 0 0 1",
                invisible_duration=Duration(seconds=30)), metadata=signed("mallory"))
            assignment = await stub.QueryAssignment(rpc.QueryAssignmentRequest(
                topic=pb.Resource(name="secret"), group=pb.Resource(name="GID-mallory")), metadata=signed("mallory"))
            forward = await stub.ForwardMessageToDeadLetterQueue(rpc.ForwardMessageToDeadLetterQueueRequest(
                group=pb.Resource(name="GID-mallory"), topic=pb.Resource(name="secret"), receipt_handle="t1 0 0 1"),
                metadata=signed("mallory"))
        assert send.status.code == pb.FORBIDDEN
        assert (assignment.status.code, forward.status.code) == (pb.FORBIDDEN, pb.FORBIDDEN)
        assert [r.status.code for r in receive] == [pb.FORBIDDEN]  # (no message before the status)
        assert (ack.status.code, change.status.code) == (pb.FORBIDDEN, pb.FORBIDDEN)
        with pytest.raises(Exception):  # its subscription to a denied topic: refused at start
            async with official_simple_consumer(endpoint, "GID-mallory", "secret", credentials=MALLORY) as consumer:
                await asyncio.to_thread(consumer.receive, 16, 30)
        # the topic it may read in part: only those messages, the rest left for the group's others
        async with official_simple_consumer(endpoint, "GID-devices", "devices", credentials=MALLORY) as consumer:
            got = await receive_all(consumer, 2)
            assert sorted(m.body for m in got) == [b"/d1/temp", b"/d2/temp"]
            for m in got:
                await asyncio.to_thread(consumer.ack, m)
            assert await asyncio.to_thread(consumer.receive, 16, 30) == []
        async with official_simple_consumer(endpoint, "GID-alice", "secret", credentials=ALICE) as consumer:
            assert [m.body for m in await receive_all(consumer, 1)] == [b"for alice"]  # never taken by mallory
