"""ReceiveMessage, AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue of
RocketMQ 5's consumers over the remoting node's pop consumption (gateway/remoting/pops.py,
gateway/core/pop.py): a receive pops every queue of the topic for the group, long-polled; its
messages stay invisible until acked or their invisible duration runs out (then they come
back), or, received with ``auto_renew`` (the PushConsumer's), while its client holds them
(renewals.py). FIFO messages (a message group's) are received in order: while one of a queue
is out to a member, the group receives nothing more of that queue. An empty receive is
MESSAGE_NOT_FOUND."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from protocols.remoting.tags import EXPRESSION_SQL92, EXPRESSION_TAG
from protocols.rocketmq_grpc.messages import GrpcRequestError, status, time_ms
from protocols.rocketmq_grpc.receipts import Receipt, decode_receipt
from store import StoreError
from store import now_ms as clock_ms

from ..auth.authorize import Principal
from ..core.pop import Popped
from ..interop import remoting_queue
from ..remoting.broker import RemotingBroker
from ..remoting.ordering import in_message_group
from ..remoting.pops import MAX_POP_MESSAGES, VALUE_LIMIT
from ..remoting.requests import BadRequest
from .codes import grpc_code_of_remoting, grpc_code_of_store_error
from .deliveries import grpc_message
from .renewals import Renewals

_EXPRESSION_TYPES = {pb.FILTER_TYPE_UNSPECIFIED: EXPRESSION_TAG, pb.TAG: EXPRESSION_TAG, pb.SQL: EXPRESSION_SQL92}


@dataclass(slots=True)
class Received:
    """One ReceiveMessage's answers (its messages, then its status), and the receipts of those
    to keep invisible while the client holds them (``auto_renew``): held by the caller once
    the messages are written, before the status (a call broken before then leaves them to
    come back after their invisible duration)."""

    answers: list[rpc.ReceiveMessageResponse]
    renewed: list[Receipt]
    group: str
    topic: str


async def receive(broker: RemotingBroker, who: Principal, request: rpc.ReceiveMessageRequest, renewals: Renewals,
                  draining: asyncio.Event) -> Received:
    """What one ReceiveMessage answers; GrpcRequestError for a request refused. A long poll
    ends at once, empty, once ``draining`` is set."""
    invisible_ms = renewals.settings.invisible_ms if request.auto_renew else _invisible_ms(request.invisible_duration)
    try:
        found, topic = await _pop(broker, who, request, invisible_ms, draining)
    except BadRequest as exc:
        raise GrpcRequestError(grpc_code_of_remoting(exc.code), str(exc)) from None
    renewed = [Receipt(queue_id, point.offset, popped.pop_time_ms + invisible_ms)
               for queue_id, popped in found for point in popped.points] if request.auto_renew else []
    answers = [rpc.ReceiveMessageResponse(message=grpc_message(
        message, topic, queue_id, point, popped.pop_time_ms + invisible_ms, invisible_ms,
        broker.msg_id(message.position)))
        for queue_id, popped in found for message, point in zip(popped.messages, popped.points)]
    broker.stats.messages_sent += len(answers)
    if not answers:
        answers.append(rpc.ReceiveMessageResponse(status=status(pb.MESSAGE_NOT_FOUND, "no new message")))
    else:  # (when they leave, as the proxy says: the PushConsumer measures its receive latency by it)
        sent = rpc.ReceiveMessageResponse()
        sent.delivery_timestamp.FromMilliseconds(clock_ms())
        answers.insert(0, sent)
        answers.append(rpc.ReceiveMessageResponse(status=status(pb.OK)))
    return Received(answers, renewed, request.group.name, topic)


async def _pop(broker: RemotingBroker, who: Principal, request: rpc.ReceiveMessageRequest, invisible_ms: int,
               draining: asyncio.Event) -> tuple[list[tuple[int, Popped]], str]:
    group, topic = request.group.name, request.message_queue.topic.name
    if not group:
        raise GrpcRequestError(pb.ILLEGAL_CONSUMER_GROUP, "the consumer group is empty")
    if not 0 < request.batch_size <= MAX_POP_MESSAGES:
        raise GrpcRequestError(pb.BAD_REQUEST, f"batch_size is 1 to {MAX_POP_MESSAGES}")
    poll_ms = time_ms(request.long_polling_timeout, pb.ILLEGAL_POLLING_TIME, "the long polling timeout")
    if poll_ms < 0:
        raise GrpcRequestError(pb.ILLEGAL_POLLING_TIME, "the long polling timeout is negative")
    if broker.topics.get(topic) is None:
        raise GrpcRequestError(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist (its route query creates it)")
    expression = request.filter_expression
    kind = _EXPRESSION_TYPES.get(expression.type)
    if kind is None:
        raise GrpcRequestError(pb.ILLEGAL_FILTER_EXPRESSION, f"filter type {expression.type} is not known")
    try:
        selector = broker.selectors.get(expression.expression or None, kind)
    except BadRequest as exc:
        raise GrpcRequestError(pb.ILLEGAL_FILTER_EXPRESSION, str(exc)) from None
    queue_ids = broker.pop_queues(topic, -1)  # (every queue of the topic, as the proxy pops them)
    pop_once = broker.pop_round(who, group, topic, queue_ids, request.batch_size, invisible_ms, selector,
                                ordered=in_message_group)  # (FIFO messages: one stretch of a queue at a time)
    found = pop_once()
    if not any(p.messages for _, p in found) and poll_ms > 0 and not draining.is_set():
        found = await _until_drained(broker.held_pop(topic, queue_ids, pop_once,
                                                     min(poll_ms / 1000, broker.long_poll_max_s)), draining)
    return found, topic


async def _until_drained(held: Coroutine[Any, Any, list[tuple[int, Popped]]], draining: asyncio.Event
                         ) -> list[tuple[int, Popped]]:
    """What a held pop finds, or nothing once ``draining`` is set first (the held pop, which
    pops only between its waits, is cancelled while it waits)."""
    pop = asyncio.ensure_future(held)
    drained = asyncio.ensure_future(draining.wait())
    try:
        await asyncio.wait((pop, drained), return_when=asyncio.FIRST_COMPLETED)
    finally:
        drained.cancel()
        if not pop.done():
            pop.cancel()
    return pop.result() if pop.done() and not pop.cancelled() else []


def ack(broker: RemotingBroker, renewals: Renewals, request: rpc.AckMessageRequest) -> rpc.AckMessageResponse:
    """Each entry acked by its receipt handle; INVALID_RECEIPT_HANDLE for one not this
    gateway's, or whose check point is gone (acked already, or the message came back)."""
    group, topic = request.group.name, request.topic.name
    try:
        read_queues = _read_queues(broker, group, topic)
    except GrpcRequestError as exc:
        return rpc.AckMessageResponse(status=status(exc.code, str(exc)))
    results = []
    for entry in request.entries:
        receipt = _receipt(entry.receipt_handle, read_queues, renewals, group, topic)
        if receipt is None:
            code, why = pb.INVALID_RECEIPT_HANDLE, "not a receipt handle of this topic"
        elif broker.pop.ack(group, remoting_queue(topic, receipt.queue_id), receipt.offset, receipt.due_ms) is None:
            code, why = pb.INVALID_RECEIPT_HANDLE, GONE
        else:
            code, why = pb.OK, ""
        results.append(rpc.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle,
                                                 status=status(code, why)))
    codes = {r.status.code for r in results}
    overall = codes.pop() if len(codes) == 1 else pb.MULTIPLE_RESULTS
    return rpc.AckMessageResponse(status=status(overall), entries=results)


def change_invisible_duration(broker: RemotingBroker, renewals: Renewals, request: rpc.ChangeInvisibleDurationRequest
                              ) -> rpc.ChangeInvisibleDurationResponse:
    """A received message made invisible for the new duration from now; its new receipt
    handle (the old one is gone)."""
    group, topic = request.group.name, request.topic.name
    try:
        invisible_ms = _invisible_ms(request.invisible_duration)
        read_queues = _read_queues(broker, group, topic)
        receipt = _receipt(request.receipt_handle, read_queues, renewals, group, topic)
        if receipt is None:
            raise GrpcRequestError(pb.INVALID_RECEIPT_HANDLE, "not a receipt handle of this topic")
        pop_time = broker.pop.change(group, remoting_queue(topic, receipt.queue_id), receipt.offset, receipt.due_ms,
                                     invisible_ms)
        if pop_time is None:
            raise GrpcRequestError(pb.INVALID_RECEIPT_HANDLE, GONE)
    except GrpcRequestError as exc:
        return rpc.ChangeInvisibleDurationResponse(status=status(exc.code, str(exc)))
    changed = Receipt(receipt.queue_id, receipt.offset, pop_time + invisible_ms)
    return rpc.ChangeInvisibleDurationResponse(status=status(pb.OK), receipt_handle=changed.encode())


async def forward_to_dead_letter(broker: RemotingBroker, renewals: Renewals,
                                 request: rpc.ForwardMessageToDeadLetterQueueRequest
                                 ) -> rpc.ForwardMessageToDeadLetterQueueResponse:
    """A received message given up on by its consumer: into the group's dead letter topic
    (``%DLQ%`` + group, as one past its attempts), its receipt then gone."""
    group, topic = request.group.name, request.topic.name
    try:
        read_queues = _read_queues(broker, group, topic)
        receipt = _receipt(request.receipt_handle, read_queues, renewals, group, topic)
        if receipt is None:
            raise GrpcRequestError(pb.INVALID_RECEIPT_HANDLE, "not a receipt handle of this topic")
        try:
            moved = await broker.pop.dead_letter(group, remoting_queue(topic, receipt.queue_id), receipt.offset,
                                                 receipt.due_ms)
        except StoreError as exc:
            raise GrpcRequestError(grpc_code_of_store_error(exc), f"store error: {exc}") from None
        if not moved:
            raise GrpcRequestError(pb.INVALID_RECEIPT_HANDLE, GONE)
    except GrpcRequestError as exc:
        return rpc.ForwardMessageToDeadLetterQueueResponse(status=status(exc.code, str(exc)))
    return rpc.ForwardMessageToDeadLetterQueueResponse(status=status(pb.OK))


GONE = "acked already, or its invisible time ran out and it came back"


def _invisible_ms(duration: Any) -> int:  # (a google.protobuf Duration)
    """A request's invisible duration; GrpcRequestError (ILLEGAL_INVISIBLE_TIME) for none, or
    one the pop service does not take (as remoting's invisibleTime)."""
    invisible_ms = time_ms(duration, pb.ILLEGAL_INVISIBLE_TIME, "the invisible duration")
    if not 0 < invisible_ms <= VALUE_LIMIT:
        raise GrpcRequestError(pb.ILLEGAL_INVISIBLE_TIME, "the invisible duration must be positive, "
                                                          f"at most {VALUE_LIMIT} ms")
    return invisible_ms


def _read_queues(broker: RemotingBroker, group: str, topic: str) -> int:
    """The read queue count of the topic an ack or change names; GrpcRequestError when it
    or the group is unknown or empty."""
    config = broker.topics.get(topic)
    if config is None:
        raise GrpcRequestError(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
    if not group:
        raise GrpcRequestError(pb.ILLEGAL_CONSUMER_GROUP, "the consumer group is empty")
    return config.read_queues


def _receipt(text: str, read_queues: int, renewals: Renewals, group: str, topic: str) -> Receipt | None:
    """The receipt ``text`` names, as its check point is due now (an auto-renewed one's:
    renewed no more); None when it is none of this topic's."""
    receipt = decode_receipt(text)
    if receipt is None or receipt.queue_id >= read_queues:
        return None
    return renewals.take(group, topic, receipt)
