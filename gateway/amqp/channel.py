"""One AMQP channel: its consumers, prefetch (basic.qos), unacknowledged deliveries, the state of
its publisher confirms and transaction, and flow; and the handlers of the channel's methods
(exchange.*, queue.*, basic.*, confirm.*, tx.*). Protocol errors raise AMQPError, which the
connection turns into channel.close or connection.close with the reply code."""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame

from protocols.amqp.frames import (
    COMMAND_INVALID,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    AMQPError,
    ContentReceived,
    channel_error,
    connection_error,
    content_after_method,
    delivery,
    method_frame,
)
from store import StoredMessage

from .arguments import CONSUMER_ARGUMENTS, argument_problem
from .confirms import Confirms
from .direct_reply import REPLY_QUEUE
from .permissions import check_method
from .queues import Consumer, QueueRuntime, Ready

# An empty set that no connection or channel owns: what their rarely used sets start as (an
# empty set is 216 bytes, and an idle connection had four); the first entry makes a real one.
NOTHING: frozenset = frozenset()

if TYPE_CHECKING:
    from .connection import AMQPConnection
    from .inbound import Inbound


log = logging.getLogger("tidemq.amqp")


@dataclass(slots=True)
class Unacked:
    queue: QueueRuntime
    message: StoredMessage
    consumer: Consumer | None  # None for basic.get


class Channel:
    # direct reply-to: its consumer's tag and the name replies to it are published to (class
    # defaults: set on the few channels that consume their replies)
    reply_consumer: str | None = None
    reply_name: str | None = None
    confirms: Confirms | None = None  # publisher confirms: set by confirm.select

    def __init__(self, connection: AMQPConnection, number: int, inbound: Inbound) -> None:
        self.connection = connection
        self.inbound = inbound  # the connection's publishes: tx.commit stores this channel's there
        self.broker = connection.broker
        self.number = number
        self._meta_before = 0  # the store's meta position when the method being handled came
        self.consumers: dict[str, Consumer] = {}
        self.unacked: OrderedDict[int, Unacked] = OrderedDict()
        self.consumer_unacked = 0  # of self.unacked, those delivered to consumers (global prefetch)
        self.consumer_unacked_bytes = 0
        self.next_tag = 1
        self.prefetch_count = 0  # per consumer (global=False) or per channel (global=True)
        self.prefetch_size = 0
        self.prefetch_global = False
        self.tx = False  # tx.select: publishes and settlements wait for tx.commit
        self.tx_publishes: list[ContentReceived] = []
        self.tx_settles: list[tuple[str, list[int], bool]] = []  # ("ack" | "reject", tags, requeue)
        self._tx_tags: set[int] | frozenset[int] = NOTHING  # (made by the first deferred settle)
        self.active = True  # channel.flow
        self.closing = False
        self._consumer_seq = 0
        self._consumer_queues: dict[str, str] = {}  # consumer tag -> queue name

    # -- delivery ------------------------------------------------------------------------------
    def can_deliver(self, consumer: Consumer, size: int) -> bool:
        if not self.active or self.closing or self.connection.writing_paused:
            return False
        if consumer.no_ack or not self.prefetch_count and not self.prefetch_size:
            return True
        if self.prefetch_global:
            count, pending_bytes = self.consumer_unacked, self.consumer_unacked_bytes
        else:
            count, pending_bytes = consumer.unacked, consumer.unacked_bytes
        if self.prefetch_count and count >= self.prefetch_count:
            return False
        return not (self.prefetch_size and count and pending_bytes + size > self.prefetch_size)

    def deliver(self, consumer: Consumer, queue: QueueRuntime, ready: Ready) -> None:
        tag = self.next_tag
        self.next_tag += 1
        message = ready.message
        view = ready.view or self.broker.view(message)
        self.broker.stats.messages_sent += 1
        self.connection.send(delivery(self.number, consumer.encoded_tag, tag, ready.redelivered, view.route,
                                      view.counted_properties(ready.delivery_count), message.body,
                                      self.connection.frame_max))
        tracer = self.connection.tracer
        if tracer is not None:
            tracer.delivered("amqp", self.connection.peer, message.position, message.queue, message.queue_offset,
                             0 if consumer.no_ack else 1)
        if consumer.no_ack:
            queue.settle_sent(message.queue_offset)
        else:
            self.unacked[tag] = Unacked(queue, message, consumer)
            size = len(message.body)
            consumer.unacked += 1
            consumer.unacked_bytes += size
            self.consumer_unacked += 1
            self.consumer_unacked_bytes += size

    def _pop_unacked(self, tag: int) -> Unacked:
        entry = self.unacked.pop(tag)
        consumer = entry.consumer
        if consumer is not None:
            size = len(entry.message.body)
            consumer.unacked -= 1
            consumer.unacked_bytes -= size
            self.consumer_unacked -= 1
            self.consumer_unacked_bytes -= size
        return entry

    def send_return(self, code: int, text: str, exchange: str, routing_key: str, raw_properties: bytes,
                    body: bytes) -> None:
        """basic.return of an unroutable mandatory publish, with its content (its properties
        as the publisher encoded them)."""
        method = commands.Basic.Return(code, text, exchange, routing_key)
        self.connection.send(method_frame(self.number, method) + content_after_method(
            self.number, raw_properties, body, self.connection.frame_max))

    def consumer_cancelled(self, consumer: Consumer) -> None:
        """The server cancels a consumer (its queue was deleted): tell the client."""
        self.consumers.pop(consumer.tag, None)
        self._consumer_queues.pop(consumer.tag, None)
        self.reply(commands.Basic.Cancel(consumer.tag, nowait=True))

    # -- closing -------------------------------------------------------------------------------
    def release(self) -> None:
        """The channel is going away: cancel its consumers, give back what it did not ack."""
        self.closing = True
        self.broker.direct_replies.cancel(self)
        for consumer in list(self.consumers.values()):
            self._cancel(consumer)
        for tag in list(self.unacked):
            entry = self._pop_unacked(tag)
            entry.queue.requeue(entry.message)

    def _cancel(self, consumer: Consumer) -> None:
        self.consumers.pop(consumer.tag, None)
        queue = self.broker.queues.get(self.broker_queue_name(consumer))
        if queue is not None:
            queue.remove_consumer(consumer)
            self.broker.declarations.after_consumer_left(queue)

    def broker_queue_name(self, consumer: Consumer) -> str:
        return self._consumer_queues.get(consumer.tag, "")

    # -- method dispatch -----------------------------------------------------------------------
    def handle(self, method: Frame) -> None:
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise connection_error(NOT_IMPLEMENTED, f"{method.name} is not implemented", self.number, method)
        check_method(self, method)  # the user's permissions (gateway/auth/authorize.py)
        self._meta_before = self.broker.store.meta_position
        handler(self, method)

    def reply(self, method: Frame) -> None:
        self.connection.send(method_frame(self.number, method))

    def _kept(self) -> None:
        """What the last method declared, bound or deleted is answered once the store keeps it as
        it promises (a replicated store: once its in-sync replicas hold the change); a method
        that changed nothing (a passive declare, a declare of what exists), once what it shows
        is held (``MessageStore.reply_settling``)."""
        settling = self.broker.store.reply_settling(self._meta_before)
        if settling is not None:
            self.connection.hold_output(settling)

    # exchange.*
    def _exchange_declare(self, m: commands.Exchange.Declare) -> None:
        self.broker.declarations.declare_exchange(self, m)
        self._kept()
        if not m.nowait:
            self.reply(commands.Exchange.DeclareOk())

    def _exchange_delete(self, m: commands.Exchange.Delete) -> None:
        self.broker.declarations.delete_exchange(self, m)
        self._kept()
        if not m.nowait:
            self.reply(commands.Exchange.DeleteOk())

    # queue.*
    def _queue_declare(self, m: commands.Queue.Declare) -> None:
        if m.passive and (m.queue == REPLY_QUEUE or self.broker.direct_replies.exists(m.queue)):
            self.reply(commands.Queue.DeclareOk(m.queue, 0, 0))  # (a pseudo-queue: always empty)
            return
        queue = self.broker.declarations.declare_queue(self, m)
        self._kept()
        if not m.nowait:
            self.reply(commands.Queue.DeclareOk(queue.name, queue.ready_count(), len(queue.consumers)))

    def _exchange_bind(self, m: commands.Exchange.Bind) -> None:
        self.broker.declarations.bind_exchange(self, m.destination, m.source, m.routing_key, m.arguments or {}, m)
        self._kept()
        if not m.nowait:
            self.reply(commands.Exchange.BindOk())

    def _exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        self.broker.declarations.unbind_exchange(self, m.destination, m.source, m.routing_key, m.arguments or {}, m)
        self._kept()
        if not m.nowait:
            self.reply(commands.Exchange.UnbindOk())

    def _queue_bind(self, m: commands.Queue.Bind) -> None:
        self.broker.declarations.bind(self, m.queue or self.connection.last_queue, m.exchange, m.routing_key, m.arguments or {})
        self._kept()
        if not m.nowait:
            self.reply(commands.Queue.BindOk())

    def _queue_unbind(self, m: commands.Queue.Unbind) -> None:
        self.broker.declarations.unbind(self, m.queue or self.connection.last_queue, m.exchange, m.routing_key, m.arguments or {})
        self._kept()
        self.reply(commands.Queue.UnbindOk())

    def _queue_purge(self, m: commands.Queue.Purge) -> None:
        queue = self.broker.declarations.queue_for(self, m.queue or self.connection.last_queue, m)
        count = queue.purge()
        self._kept()
        if not m.nowait:
            self.reply(commands.Queue.PurgeOk(count))

    def _queue_delete(self, m: commands.Queue.Delete) -> None:
        count = self.broker.declarations.delete_queue(self, m)
        self._kept()
        if not m.nowait:
            self.reply(commands.Queue.DeleteOk(count))

    # basic.*
    def _basic_qos(self, m: commands.Basic.Qos) -> None:
        self.prefetch_count = m.prefetch_count
        self.prefetch_size = m.prefetch_size
        self.prefetch_global = m.global_
        self.reply(commands.Basic.QosOk())
        for consumer in self.consumers.values():
            queue = self.broker.queues.get(self.broker_queue_name(consumer))
            if queue is not None:
                queue.schedule_pump()

    def _basic_consume(self, m: commands.Basic.Consume) -> None:
        problem = argument_problem(CONSUMER_ARGUMENTS, "consumer", m.arguments or {})
        if problem:
            raise channel_error(PRECONDITION_FAILED, problem, self.number, m)
        if m.queue == REPLY_QUEUE:
            tag = self._new_consumer_tag(m)
            self.broker.direct_replies.consume(self, tag, m)
            if not m.nowait:
                self.reply(commands.Basic.ConsumeOk(tag))
            return
        queue = self.broker.declarations.queue_for(self, m.queue or self.connection.last_queue, m)
        if queue.owner is not None and queue.owner is not self.connection:
            raise channel_error(RESOURCE_LOCKED, f"queue '{queue.name}' is exclusive to another connection",
                                self.number, m)
        if any(c.exclusive for c in queue.consumers.values()) or (m.exclusive and queue.consumers):
            raise channel_error(RESOURCE_LOCKED, f"queue '{queue.name}' has an exclusive consumer", self.number, m)
        tag = self._new_consumer_tag(m)
        priority = (m.arguments or {}).get("x-priority", 0)
        assert isinstance(priority, int)  # (CONSUMER_ARGUMENTS let an integer through only)
        consumer = Consumer(self, tag, m.no_ack, m.exclusive, priority)
        self.consumers[tag] = consumer
        self._consumer_queues[tag] = queue.name
        if not m.nowait:
            self.reply(commands.Basic.ConsumeOk(tag))
        queue.add_consumer(consumer)

    def _new_consumer_tag(self, m: commands.Basic.Consume) -> str:
        tag = m.consumer_tag
        if not tag:
            self._consumer_seq += 1
            return f"amq.ctag-{id(self):x}-{self._consumer_seq}"
        if tag in self.consumers or tag == self.reply_consumer:
            raise connection_error(COMMAND_INVALID, f"consumer tag '{tag}' is already in use", self.number, m)
        return tag

    def _basic_cancel(self, m: commands.Basic.Cancel) -> None:
        assert m.consumer_tag is not None  # (a decoded method has every field)
        consumer = self.consumers.get(m.consumer_tag)
        if consumer is not None:
            self._cancel(consumer)
        elif m.consumer_tag == self.reply_consumer:
            self.broker.direct_replies.cancel(self)
        if not m.nowait:
            self.reply(commands.Basic.CancelOk(m.consumer_tag))

    def _basic_get(self, m: commands.Basic.Get) -> None:
        queue = self.broker.declarations.queue_for(self, m.queue or self.connection.last_queue, m)
        queue.touch()
        ready = queue.take()
        if ready is None:
            self.reply(commands.Basic.GetEmpty())
            return
        tag = self.next_tag
        self.next_tag += 1
        view = self.broker.view(ready.message)
        method = commands.Basic.GetOk(tag, ready.redelivered, view.exchange, view.routing_key, queue.ready_count())
        self.broker.stats.messages_sent += 1
        self.connection.send(method_frame(self.number, method))
        self.connection.send(content_after_method(self.number, view.counted_properties(ready.delivery_count),
                                                  ready.message.body, self.connection.frame_max))
        tracer = self.connection.tracer
        if tracer is not None:
            message = ready.message
            tracer.delivered("amqp", self.connection.peer, message.position, message.queue, message.queue_offset,
                             0 if m.no_ack else 1)
        if m.no_ack:
            queue.settle(ready.message.queue_offset)
        else:
            self.unacked[tag] = Unacked(queue, ready.message, None)
        queue.save()

    def _tags(self, tag: int, multiple: bool, method: Frame) -> list[int]:
        if multiple:
            if tag:
                tags = []
                for t in self.unacked:  # (in tag order: entries are only ever added with a higher tag)
                    if t > tag:
                        break
                    tags.append(t)
            else:
                tags = list(self.unacked)
        else:
            tags = [tag] if tag in self.unacked else []
        if not tags and not (multiple and tag == 0):
            raise channel_error(PRECONDITION_FAILED, f"unknown delivery tag {tag}", self.number, method)
        return tags

    def _basic_ack(self, m: commands.Basic.Ack) -> None:
        tags = self._tags(m.delivery_tag, m.multiple, m)
        if not self._defer_settle("ack", tags, False, m):
            self._settle(tags)

    def _settle(self, tags: list[int]) -> None:
        settled: dict[QueueRuntime, list[int]] = {}
        tracer = self.connection.tracer
        for tag in tags:
            entry = self._pop_unacked(tag)
            message = entry.message
            offsets = settled.get(entry.queue)
            if offsets is None:
                settled[entry.queue] = [message.queue_offset]
            else:
                offsets.append(message.queue_offset)
            if tracer is not None:
                tracer.acked("amqp", self.connection.peer, message.position, message.queue, message.queue_offset)
        for queue, offsets in settled.items():
            queue.settle_many(offsets)

    def _reject(self, tags: list[int], requeue: bool) -> None:
        touched = set()
        for tag in tags:
            entry = self._pop_unacked(tag)
            if requeue:
                entry.queue.requeue(entry.message)
            else:
                entry.queue.settle(entry.message.queue_offset)
                self.broker.dead_letter(entry.queue, entry.message, "rejected")
            touched.add(entry.queue)
        for queue in touched:
            queue.save()

    def _basic_nack(self, m: commands.Basic.Nack) -> None:
        tags = self._tags(m.delivery_tag, m.multiple, m)
        if not self._defer_settle("reject", tags, m.requeue, m):
            self._reject(tags, m.requeue)

    def _basic_reject(self, m: commands.Basic.Reject) -> None:
        assert m.delivery_tag is not None  # (a decoded method has every field)
        tags = self._tags(m.delivery_tag, False, m)
        if not self._defer_settle("reject", tags, m.requeue, m):
            self._reject(tags, m.requeue)

    def _basic_recover(self, m: commands.Basic.Recover) -> None:
        self._reject(list(self.unacked), True)
        self.reply(commands.Basic.RecoverOk())

    # confirm.* and channel.flow
    def _confirm_select(self, m: commands.Confirm.Select) -> None:
        if self.tx:
            raise channel_error(PRECONDITION_FAILED, "cannot switch from tx to confirm mode", self.number, m)
        if self.confirms is None:
            self.confirms = Confirms()
        if not m.nowait:
            self.reply(commands.Confirm.SelectOk())

    def _channel_flow(self, m: commands.Channel.Flow) -> None:
        assert m.active is not None  # (a decoded method has every field)
        self.active = m.active
        self.reply(commands.Channel.FlowOk(m.active))
        if self.active:
            for consumer in self.consumers.values():
                queue = self.broker.queues.get(self.broker_queue_name(consumer))
                if queue is not None:
                    queue.schedule_pump()

    # tx.*: publishes and acknowledgements of a transactional channel wait for tx.commit
    def _tx_select(self, m: commands.Tx.Select) -> None:
        if self.confirms is not None:
            raise channel_error(PRECONDITION_FAILED, "cannot switch from confirm to tx mode", self.number, m)
        self.tx = True
        self.reply(commands.Tx.SelectOk())

    def _tx_commit(self, m: commands.Tx.Commit) -> None:
        if not self.tx:
            raise channel_error(PRECONDITION_FAILED, "channel is not transactional", self.number, m)
        settles, self.tx_settles = self.tx_settles, []
        self._tx_tags = NOTHING
        for kind, tags, requeue in settles:
            if kind == "ack":
                self._settle(tags)
            else:
                self._reject(tags, requeue)
        self.inbound.commit(self, m)  # its publishes: stored, then commit-ok

    def _tx_rollback(self, m: commands.Tx.Rollback) -> None:
        if not self.tx:
            raise channel_error(PRECONDITION_FAILED, "channel is not transactional", self.number, m)
        self.tx_publishes.clear()
        self.tx_settles.clear()
        self._tx_tags = NOTHING
        self.reply(commands.Tx.RollbackOk())

    def _defer_settle(self, kind: str, tags: list[int], requeue: bool, method: Frame) -> bool:
        """In a transaction, remember an ack/nack/reject for tx.commit (True: deferred)."""
        if not self.tx:
            return False
        if self._tx_tags.intersection(tags):
            raise channel_error(PRECONDITION_FAILED, "delivery tag already settled in this transaction",
                                self.number, method)
        if isinstance(self._tx_tags, frozenset):  # (NOTHING, until the first)
            self._tx_tags = set()
        self._tx_tags.update(tags)
        self.tx_settles.append((kind, tags, requeue))
        return True

# (a method class -> its handler: Any, as no type pairs key and value)
_HANDLERS: dict[type[Frame], Callable[[Channel, Any], None]] = {
    commands.Exchange.Declare: Channel._exchange_declare,
    commands.Exchange.Delete: Channel._exchange_delete,
    commands.Exchange.Bind: Channel._exchange_bind,
    commands.Exchange.Unbind: Channel._exchange_unbind,
    commands.Queue.Declare: Channel._queue_declare,
    commands.Queue.Bind: Channel._queue_bind,
    commands.Queue.Unbind: Channel._queue_unbind,
    commands.Queue.Purge: Channel._queue_purge,
    commands.Queue.Delete: Channel._queue_delete,
    commands.Basic.Qos: Channel._basic_qos,
    commands.Basic.Consume: Channel._basic_consume,
    commands.Basic.Cancel: Channel._basic_cancel,
    commands.Basic.Get: Channel._basic_get,
    commands.Basic.Ack: Channel._basic_ack,
    commands.Basic.Nack: Channel._basic_nack,
    commands.Basic.Reject: Channel._basic_reject,
    commands.Basic.Recover: Channel._basic_recover,
    commands.Confirm.Select: Channel._confirm_select,
    commands.Channel.Flow: Channel._channel_flow,
    commands.Tx.Select: Channel._tx_select,
    commands.Tx.Commit: Channel._tx_commit,
    commands.Tx.Rollback: Channel._tx_rollback,
}

