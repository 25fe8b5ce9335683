"""The official Python client's PushConsumer over gRPC: its assignment (QueryAssignment), its
auto-renewed receives, acks of what its listener consumed, redelivery of what its listener
failed, in-order consumption for a group configured FIFO (``grpc_fifo_groups``), and what a
client that ends held coming back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.v5.consumer import ConsumeResult, MessageListener
from rocketmq.v5.model import Message

from gateway.rocketmq_grpc.renewals import RenewalSettings
from gateway.server import Gateway
from tests.grpc_support import grpc_gateway, official_producer, official_push_consumer, raw_stub
from tests.test_grpc import fifo_message, normal_message


class Recorder(MessageListener):
    """Each consumption (body, delivery attempt) in the order the listener saw them; ``result``
    says what the listener answers."""

    def __init__(self, result: Callable[[Message], ConsumeResult] = lambda m: ConsumeResult.SUCCESS) -> None:
        self.result = result
        self.seen: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.seen.append((message.body.decode(), message.delivery_attempt))
        return self.result(message)

    async def wait_for(self, count: int, timeout_s: float = 30) -> list[tuple[str, int]]:
        deadline = time.monotonic() + timeout_s
        while len(self.seen) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        with self.lock:
            return list(self.seen)


async def all_acked(gw: Gateway, group: str, timeout_s: float = 10) -> bool:
    """Whether the group has no message out (received and not acked) within ``timeout_s``."""
    assert gw.remoting is not None
    deadline = time.monotonic() + timeout_s
    while gw.remoting.pop.outstanding(group) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return not gw.remoting.pop.outstanding(group)


async def test_push_consumer_receives_and_acks_every_message_the_producer_sends(data_dir: Path) -> None:
    async with grpc_gateway(data_dir) as (gw, endpoint, _):
        async with official_producer(endpoint, "GrpcPush") as producer:
            for i in range(12):
                await asyncio.to_thread(producer.send, normal_message("GrpcPush", f"m{i}".encode(), tag="t"))
            recorder = Recorder()
            async with official_push_consumer(endpoint, "GID-push", "GrpcPush", recorder, "t") as consumer:
                seen = await recorder.wait_for(12)
                assert sorted(seen) == sorted((f"m{i}", 1) for i in range(12))
                assert await all_acked(gw, "GID-push")
                assert consumer.fifo is False
                # (sent while it runs: pushed too, by its long-polling receive)
                await asyncio.to_thread(producer.send, normal_message("GrpcPush", b"later", tag="t"))
                assert (await recorder.wait_for(13))[12:] == [("later", 1)]
                assert await all_acked(gw, "GID-push")
        async with raw_stub(endpoint) as stub:
            assignment = await stub.QueryAssignment(rpc.QueryAssignmentRequest(
                topic=pb.Resource(name="GrpcPush"), group=pb.Resource(name="GID-push")))
            unknown = await stub.QueryAssignment(rpc.QueryAssignmentRequest(
                topic=pb.Resource(name="NoSuchTopic"), group=pb.Resource(name="GID-push")))
        assert assignment.status.code == pb.OK
        assert [(a.message_queue.topic.name, a.message_queue.id, a.message_queue.permission)
                for a in assignment.assignments] == [("GrpcPush", -1, pb.READ_WRITE)]
        assert unknown.status.code == pb.TOPIC_NOT_FOUND


async def test_a_message_the_listener_fails_is_delivered_again(data_dir: Path) -> None:
    async with grpc_gateway(data_dir) as (gw, endpoint, _):
        async with official_producer(endpoint, "GrpcPushRetry") as producer:
            for body in (b"good", b"flaky", b"raises"):
                await asyncio.to_thread(producer.send, normal_message("GrpcPushRetry", body))

        def result(message: Message) -> ConsumeResult:
            if message.delivery_attempt == 1 and message.body == b"raises":
                raise RuntimeError("the listener broke")
            return ConsumeResult.FAILURE if message.delivery_attempt == 1 and message.body == b"flaky" \
                else ConsumeResult.SUCCESS
        recorder = Recorder(result)
        async with official_push_consumer(endpoint, "GID-retry", "GrpcPushRetry", recorder):
            seen = await recorder.wait_for(5)
            assert await all_acked(gw, "GID-retry")
        assert sorted(seen) == [("flaky", 1), ("flaky", 2), ("good", 1), ("raises", 1), ("raises", 2)]


async def test_a_fifo_group_is_consumed_in_order(data_dir: Path) -> None:
    async with grpc_gateway(data_dir, remoting_default_queues=2, grpc_fifo_groups="GID-ordered") as (gw, endpoint, _):
        groups = ("red", "blue", "green")
        async with official_producer(endpoint, "GrpcPushFifo") as producer:
            for i in range(8):
                for group in groups:
                    await asyncio.to_thread(producer.send, fifo_message("GrpcPushFifo", f"{group}-{i}".encode(), group))

        def result(message: Message) -> ConsumeResult:
            time.sleep(0.01)  # (a listener that takes a while: later messages would overtake it)
            return ConsumeResult.SUCCESS
        recorder = Recorder(result)
        async with official_push_consumer(endpoint, "GID-ordered", "GrpcPushFifo", recorder) as consumer:
            seen = await recorder.wait_for(8 * len(groups))
            assert await all_acked(gw, "GID-ordered")
            assert consumer.fifo is True
        for group in groups:
            assert [body for body, _ in seen if body.startswith(group)] == [f"{group}-{i}" for i in range(8)]


async def test_what_a_slow_listener_holds_is_renewed_until_it_is_acked(data_dir: Path) -> None:
    async with grpc_gateway(data_dir) as (gw, endpoint, _):
        assert gw.grpc is not None and gw.grpc.service is not None
        gw.grpc.service.renewals.settings = RenewalSettings(invisible_ms=1500, ahead_ms=1000)
        async with official_producer(endpoint, "GrpcPushSlow") as producer:
            await asyncio.to_thread(producer.send, normal_message("GrpcPushSlow", b"slow"))

        def result(message: Message) -> ConsumeResult:
            time.sleep(4)  # (past its invisible duration, twice over)
            return ConsumeResult.SUCCESS
        recorder = Recorder(result)
        async with official_push_consumer(endpoint, "GID-slow", "GrpcPushSlow", recorder):
            assert await recorder.wait_for(1) == [("slow", 1)]
            assert await all_acked(gw, "GID-slow")
            assert recorder.seen == [("slow", 1)]  # (not delivered again while it was consumed)


async def test_what_an_ended_client_held_comes_back(data_dir: Path) -> None:
    """Received with auto_renew, then the client ends (NotifyClientTermination): its message
    is renewed no more and comes back to the group soon, not after the auto-renewed duration."""
    async with grpc_gateway(data_dir) as (gw, endpoint, _):
        async with official_producer(endpoint, "GrpcPushEnded") as producer:
            await asyncio.to_thread(producer.send, normal_message("GrpcPushEnded", b"held"))
        request = rpc.ReceiveMessageRequest(
            group=pb.Resource(name="GID-ended"), message_queue=pb.MessageQueue(topic=pb.Resource(name="GrpcPushEnded")),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"), batch_size=4, auto_renew=True)
        async with raw_stub(endpoint) as stub:
            first = [r async for r in stub.ReceiveMessage(request, metadata=(("x-mq-client-id", "one"),))]
            assert [r.message.body for r in first if r.HasField("message")] == [b"held"]
            ended = await stub.NotifyClientTermination(rpc.NotifyClientTerminationRequest(
                group=pb.Resource(name="GID-ended")), metadata=(("x-mq-client-id", "one"),))
            assert ended.status.code == pb.OK
            request.long_polling_timeout.FromSeconds(10)
            again = [r async for r in stub.ReceiveMessage(request, metadata=(("x-mq-client-id", "two"),))]
        assert [(r.message.body, r.message.system_properties.delivery_attempt) for r in again
                if r.HasField("message")] == [(b"held", 2)]
