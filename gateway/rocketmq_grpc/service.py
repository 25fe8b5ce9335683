"""The ``MessagingService`` calls RocketMQ 5 clients make, answered from the remoting node
(gateway/remoting/broker.py): its topics and queues, and its one send path, so a message sent
over gRPC is stored and read as a remoting send is. Each call is authenticated and checked
against the ACL as its remoting counterpart (access.py); a reply after meta changes (a topic
created, check points, offsets) waits until a replicated store holds them, as remoting's
replies do. Calls not built yet answer UNIMPLEMENTED (grpcio's default) rather than something
close."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import AsyncIterator

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc
from rocketmq.grpc_protocol.service_pb2_grpc import MessagingServiceServicer

from protocols.remoting.properties import TRAN_MSG
from protocols.rocketmq_grpc.messages import SUPPORTED_TYPES, GrpcRequestError, grpc_send, send_identity, status
from protocols.rocketmq_grpc.receipts import transaction_id
from store import StoreError

from ..pressure import StorePressure
from ..remoting.access import Right
from ..remoting.broker import RemotingBroker
from ..remoting.messages import checked_properties
from ..remoting.requests import BadRequest
from ..remoting.topics import PERM_READ, PERM_WRITE, valid_topic
from . import consumption, transactions
from .access import GrpcAccess, call_metadata
from .codes import grpc_code_of_remoting, grpc_code_of_store_error
from .renewals import Renewals
from .telemetry import TelemetrySession

log = logging.getLogger("tidemq.grpc")

MAX_BODY_SIZE_DEFAULT = 4 << 20  # (clamped to the store's limit)
CLIENT_ID = "x-mq-client-id"  # (metadata of every call of the official clients)
PUSH_BATCH_SIZE = 32  # what a PushConsumer receives at most at once (its own default)


class MessagingService(MessagingServiceServicer):
    def __init__(self, broker: RemotingBroker, advertised: tuple[str, int], pressure: StorePressure | None = None,
                 *, fifo_groups: frozenset[str] = frozenset(), renewals: Renewals | None = None) -> None:
        self.broker = broker
        self.pressure = pressure  # while its alarm is raised, sends are TOO_MANY_REQUESTS (clients back off)
        self.advertised = advertised  # HOST:PORT of the gRPC listener, named in routes
        self.tls_advertised = advertised  # ... of its TLS port, for calls that came over TLS
        self.shared_advertised = advertised  # ... and of the remoting port, for calls that came over it
        self.fifo_groups = fifo_groups  # consumer groups whose PushConsumers consume in order
        self.renewals = renewals or Renewals(broker.pop)  # what PushConsumers hold (auto_renew)
        self.draining = asyncio.Event()  # set on shutdown: long polls end at once, empty
        self.sessions: set[TelemetrySession] = set()  # the open Telemetry streams
        self._next_queue = itertools.count()  # round robin over a topic's queues for sends
        self.access = GrpcAccess(broker.access)

    # -- routes --------------------------------------------------------------------------------
    async def QueryRoute(self, request: rpc.QueryRouteRequest, context: grpc.aio.ServicerContext
                         ) -> rpc.QueryRouteResponse:
        name = request.topic.name
        meta_before = self.broker.store.meta_position
        try:
            who = self.access.principal(context, "query_route")
            self.access.check_topic(who, name, Right.USE, "query_route")  # (before it is created)
            try:
                topic = self.broker.topics.ensure(name)  # created with the default queues, as remoting does
            except ValueError as exc:
                raise GrpcRequestError(pb.ILLEGAL_TOPIC, str(exc)) from None
            await self._settled(meta_before)
        except GrpcRequestError as exc:
            return rpc.QueryRouteResponse(status=status(exc.code, str(exc)))
        queues = [self._message_queue(context, request.topic, queue_id, topic.perm)
                  for queue_id in range(max(topic.read_queues, topic.write_queues))]
        return rpc.QueryRouteResponse(status=status(pb.OK), message_queues=queues)

    async def QueryAssignment(self, request: rpc.QueryAssignmentRequest, context: grpc.aio.ServicerContext
                              ) -> rpc.QueryAssignmentResponse:
        """A PushConsumer's queues: one for this node, id -1 (every queue of the topic, as a
        receive pops them all), as the proxy assigns a group over its brokers' pop."""
        try:
            who = self.access.principal(context, "query_assignment")
            self.access.check_topic(who, request.topic.name, Right.READ, "query_assignment")
            if not request.group.name:
                raise GrpcRequestError(pb.ILLEGAL_CONSUMER_GROUP, "the consumer group is empty")
            topic = self.broker.topics.get(request.topic.name)
            if topic is None:
                raise GrpcRequestError(pb.TOPIC_NOT_FOUND, f"topic {request.topic.name!r} does not exist "
                                                           "(its route query creates it)")
        except GrpcRequestError as exc:
            return rpc.QueryAssignmentResponse(status=status(exc.code, str(exc)))
        queue = self._message_queue(context, request.topic, -1, topic.perm)
        return rpc.QueryAssignmentResponse(status=status(pb.OK), assignments=[pb.Assignment(message_queue=queue)])

    def _message_queue(self, context: grpc.aio.ServicerContext, topic: pb.Resource, queue_id: int, perm: int
                       ) -> pb.MessageQueue:
        """A queue on this node, at the port the call came to (gRPC's plain or TLS one, or the
        remoting one)."""
        if context.peer() in self.access.forwarded:
            host, port = self.shared_advertised
        elif context.auth_context().get("transport_security_type") == [b"ssl"]:
            host, port = self.tls_advertised
        else:
            host, port = self.advertised
        broker = pb.Broker(name=self.broker.broker_name, id=0, endpoints=pb.Endpoints(
            scheme=pb.IPv6 if ":" in host else pb.IPv4, addresses=[pb.Address(host=host, port=port)]))
        permission = {PERM_READ | PERM_WRITE: pb.READ_WRITE, PERM_READ: pb.READ, PERM_WRITE: pb.WRITE}.get(
            perm & (PERM_READ | PERM_WRITE), pb.NONE)
        return pb.MessageQueue(topic=topic, id=queue_id, permission=permission, broker=broker,
                               accept_message_types=SUPPORTED_TYPES)

    # -- clients -------------------------------------------------------------------------------
    async def Heartbeat(self, request: rpc.HeartbeatRequest, context: grpc.aio.ServicerContext
                        ) -> rpc.HeartbeatResponse:
        try:
            self.access.principal(context, "heartbeat")
        except GrpcRequestError as exc:
            return rpc.HeartbeatResponse(status=status(exc.code, str(exc)))
        return rpc.HeartbeatResponse(status=status(pb.OK))

    async def NotifyClientTermination(self, request: rpc.NotifyClientTerminationRequest,
                                      context: grpc.aio.ServicerContext) -> rpc.NotifyClientTerminationResponse:
        """The client's auto-renewed messages come back soon (renewals.py)."""
        try:
            self.access.principal(context, "notify_client_termination")
        except GrpcRequestError as exc:
            return rpc.NotifyClientTerminationResponse(status=status(exc.code, str(exc)))
        self.renewals.release(_client_id(context))
        return rpc.NotifyClientTerminationResponse(status=status(pb.OK))

    async def Telemetry(self, requests: AsyncIterator[rpc.TelemetryCommand], context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[rpc.TelemetryCommand]:
        """Each client's settings answered with the server's (a consumer's subscriptions need
        read rights on their topics, as a remoting consumer's heartbeat does); a producer's
        stream carries the checks of its transactions (telemetry.py)."""
        try:
            who = self.access.principal(context, "telemetry")
        except GrpcRequestError as exc:
            yield rpc.TelemetryCommand(status=status(exc.code, str(exc)))
            return

        def answer(client: pb.Settings) -> pb.Settings:
            for entry in client.subscription.subscriptions:
                self.access.check_topic(who, entry.topic.name, Right.READ, "telemetry")
            return self._settings(client)
        client_id = _client_id(context)
        session = TelemetrySession(self.broker, who, client_id)
        self.sessions.add(session)
        if self.draining.is_set():
            session.end()
        try:
            async for command in session.run(requests, answer):
                yield command
        finally:  # (the client is gone: what it held comes back, as at its termination)
            self.sessions.discard(session)
            self.renewals.release(client_id)

    def drain(self) -> None:
        """Shutdown: long polls end at once, empty; Telemetry streams end (their clients open
        them again elsewhere)."""
        self.draining.set()
        for session in self.sessions:
            session.end()

    def _settings(self, client: pb.Settings) -> pb.Settings:
        settings = pb.Settings()
        settings.CopyFrom(client)
        if client.HasField("publishing"):
            limit = min(MAX_BODY_SIZE_DEFAULT, self.broker.store.options.max_message_size)
            settings.publishing.max_body_size = limit
            settings.publishing.validate_message_type = True
        if client.HasField("subscription"):  # (a consumer: retried as the remoting side's, by its delay levels)
            subscription = settings.subscription
            subscription.fifo = client.subscription.group.name in self.fifo_groups
            subscription.receive_batch_size = PUSH_BATCH_SIZE
            subscription.long_polling_timeout.FromSeconds(max(1, int(self.broker.long_poll_max_s)))
            settings.backoff_policy.max_attempts = self.broker.max_reconsume_times + 1
            for delay_s in self.broker.schedule.delays_s:  # (the clients take whole seconds)
                settings.backoff_policy.customized_backoff.next.add().FromSeconds(max(1, math.ceil(delay_s)))
            return settings
        settings.backoff_policy.max_attempts = client.backoff_policy.max_attempts or 3
        settings.backoff_policy.exponential_backoff.initial.FromMilliseconds(10)
        settings.backoff_policy.exponential_backoff.max.FromSeconds(1)
        settings.backoff_policy.exponential_backoff.multiplier = 2.0
        return settings

    # -- consumers: receive, ack, change invisible duration (consumption.py) -----------------
    async def ReceiveMessage(self, request: rpc.ReceiveMessageRequest, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[rpc.ReceiveMessageResponse]:
        meta_before = self.broker.store.meta_position
        try:
            who = self.access.principal(context, "receive_message")
            self.access.check_topic(who, request.message_queue.topic.name, Right.READ, "receive_message")
            received = await consumption.receive(self.broker, who, request, self.renewals, self.draining)
            await self._settled(meta_before)  # (its check points: else none is shown)
        except GrpcRequestError as exc:
            yield rpc.ReceiveMessageResponse(status=status(exc.code, str(exc)))
            return
        *messages, answered = received.answers
        for answer in messages:
            yield answer
        client_id = _client_id(context)
        for receipt in received.renewed:  # (the client has them: kept invisible while it holds them)
            self.renewals.hold(client_id, received.group, received.topic, receipt)
        yield answered

    async def AckMessage(self, request: rpc.AckMessageRequest, context: grpc.aio.ServicerContext
                         ) -> rpc.AckMessageResponse:
        meta_before = self.broker.store.meta_position
        try:
            who = self.access.principal(context, "ack_message")
            self.access.check_topic(who, request.topic.name, Right.READ, "ack_message")
            answer = consumption.ack(self.broker, self.renewals, request)
            await self._settled(meta_before)
        except GrpcRequestError as exc:
            return rpc.AckMessageResponse(status=status(exc.code, str(exc)))
        return answer

    async def ChangeInvisibleDuration(self, request: rpc.ChangeInvisibleDurationRequest,
                                      context: grpc.aio.ServicerContext) -> rpc.ChangeInvisibleDurationResponse:
        meta_before = self.broker.store.meta_position
        try:
            who = self.access.principal(context, "change_invisible_duration")
            self.access.check_topic(who, request.topic.name, Right.READ, "change_invisible_duration")
            answer = consumption.change_invisible_duration(self.broker, self.renewals, request)
            await self._settled(meta_before)
        except GrpcRequestError as exc:
            return rpc.ChangeInvisibleDurationResponse(status=status(exc.code, str(exc)))
        return answer

    async def ForwardMessageToDeadLetterQueue(self, request: rpc.ForwardMessageToDeadLetterQueueRequest,
                                              context: grpc.aio.ServicerContext
                                              ) -> rpc.ForwardMessageToDeadLetterQueueResponse:
        meta_before = self.broker.store.meta_position
        try:
            who = self.access.principal(context, "forward_message_to_dead_letter_queue")
            self.access.check_topic(who, request.topic.name, Right.READ, "forward_message_to_dead_letter_queue")
            answer = await consumption.forward_to_dead_letter(self.broker, self.renewals, request)
            await self._settled(meta_before)
        except GrpcRequestError as exc:
            return rpc.ForwardMessageToDeadLetterQueueResponse(status=status(exc.code, str(exc)))
        return answer

    async def _settled(self, meta_before: int) -> None:
        """Once the meta changes made since ``meta_before`` are held as the store promises
        (``MessageStore.reply_settling``); GrpcRequestError when they are not."""
        settling = self.broker.store.reply_settling(meta_before)
        if settling is not None:
            try:
                await settling
            except StoreError as exc:
                raise GrpcRequestError(grpc_code_of_store_error(exc), f"store error: {exc}") from None

    # -- transactions (transactions.py; their checks: telemetry.py) ---------------------------
    async def EndTransaction(self, request: rpc.EndTransactionRequest, context: grpc.aio.ServicerContext
                             ) -> rpc.EndTransactionResponse:
        meta_before = self.broker.store.meta_position
        try:
            who = self.access.principal(context, "end_transaction")
            await transactions.end(self.broker, who, request)
            await self._settled(meta_before)
        except GrpcRequestError as exc:
            return rpc.EndTransactionResponse(status=status(exc.code, str(exc)))
        return rpc.EndTransactionResponse(status=status(pb.OK))

    # -- sending -------------------------------------------------------------------------------
    async def SendMessage(self, request: rpc.SendMessageRequest, context: grpc.aio.ServicerContext
                          ) -> rpc.SendMessageResponse:
        try:
            who = self.access.principal(context, "send_message")  # (its topic: put_message checks the send)
            if len(request.messages) != 1:  # (the clients send one at a time; a batch is one queue's)
                raise GrpcRequestError(pb.UNSUPPORTED, "send one message per request")
            if self.pressure is not None and self.pressure.raised:
                raise GrpcRequestError(pb.TOO_MANY_REQUESTS, f"publishers are blocked: {self.pressure.reason}")
            send = grpc_send(request.messages[0])
            if not valid_topic(send.topic):
                raise GrpcRequestError(pb.ILLEGAL_TOPIC, f"topic name {send.topic!r} is not valid "
                                                         "(at most 127 of [%|a-zA-Z0-9_-])")
            sent = self.broker.put_message(who, send.topic, send.body, checked_properties(send.properties),
                                           queue_id=next(self._next_queue), born_timestamp=send.born_timestamp,
                                           born_host=send.born_host,
                                           producer=send_identity(_client_id(context), send.topic, send.message_id))
            results = await sent.future  # (it follows any meta change in the log: held once it is)
        except GrpcRequestError as exc:
            return rpc.SendMessageResponse(status=status(exc.code, str(exc)))
        except BadRequest as exc:
            return rpc.SendMessageResponse(status=status(grpc_code_of_remoting(exc.code), str(exc)))
        except StoreError as exc:
            return rpc.SendMessageResponse(status=status(grpc_code_of_store_error(exc), f"store error: {exc}"))
        entry = rpc.SendResultEntry(status=status(pb.OK), message_id=send.message_id,
                                    offset=results[0].queue_offsets.get(sent.own, -1))
        if TRAN_MSG in sent.properties:  # (a half message: its end names it by where it is)
            entry.transaction_id = transaction_id(results[0].position)
        return rpc.SendMessageResponse(status=status(pb.OK), entries=[entry])


def _client_id(context: grpc.aio.ServicerContext) -> str:
    """Who makes the call: the client id the official clients send, else its address."""
    return call_metadata(context).get(CLIENT_ID) or context.peer()  # (the forward's peer is as unique)
