"""One client's Telemetry stream: its settings answered with the server's, and the server's
commands sent down it while it is open -- a transaction check of a half message its producer
sent (the remoting side's transaction service asks it as it asks a remoting producer:
gateway/remoting/transactions.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from protocols.rocketmq_grpc.messages import GrpcRequestError, status
from protocols.rocketmq_grpc.receipts import transaction_id
from store import Hold, StoredMessage

from ..auth.authorize import Principal
from ..interop import remoting_topic_of
from ..remoting.broker import RemotingBroker
from .deliveries import grpc_half_message

# a client's settings -> the server's answer (raises GrpcRequestError to refuse them)
Answer = Callable[[pb.Settings], pb.Settings]


class TelemetrySession:
    def __init__(self, broker: RemotingBroker, who: Principal, client_id: str) -> None:
        self.broker = broker
        self.principal = who
        self.client_id = client_id
        self.closed = False
        self.outgoing: asyncio.Queue[rpc.TelemetryCommand | None] = asyncio.Queue()  # (None: the end)

    def end(self) -> None:
        """End the stream to the client (the server is stopping)."""
        self.outgoing.put_nowait(None)

    async def run(self, requests: AsyncIterator[rpc.TelemetryCommand], answer: Answer
                  ) -> AsyncIterator[rpc.TelemetryCommand]:
        """The commands to the client: answers to its settings, and checks, until it ends the stream."""
        reader = asyncio.ensure_future(self._read(requests, answer))
        try:
            while (command := await self.outgoing.get()) is not None:
                yield command
        finally:
            reader.cancel()
            self.closed = True
            self.broker.producers.connection_closed(self)

    async def _read(self, requests: AsyncIterator[rpc.TelemetryCommand], answer: Answer) -> None:
        try:
            async for command in requests:
                if not command.HasField("settings"):
                    continue  # (thread stack and verification answers: no command asks for them)
                try:
                    settings = answer(command.settings)
                except GrpcRequestError as exc:
                    self.outgoing.put_nowait(rpc.TelemetryCommand(status=status(exc.code, str(exc))))
                    continue
                for topic in command.settings.publishing.topics:  # (a producer: checked about its transactions)
                    self.broker.producers.heartbeat(topic.name, self.client_id, self)
                self.outgoing.put_nowait(rpc.TelemetryCommand(status=status(pb.OK), settings=settings))
        finally:
            self.outgoing.put_nowait(None)

    def check_transaction(self, message: StoredMessage, hold: Hold) -> None:
        """Ask this producer about a half message: RecoverOrphanedTransactionCommand, answered
        by an EndTransaction naming its transaction id."""
        topic, queue_id = remoting_topic_of(hold.queues[0]) or (message.topic, 0)
        half = grpc_half_message(message, topic, queue_id, self.broker.msg_id(hold.target))
        self.outgoing.put_nowait(rpc.TelemetryCommand(
            recover_orphaned_transaction_command=rpc.RecoverOrphanedTransactionCommand(
                message=half, transaction_id=transaction_id(hold.target))))
