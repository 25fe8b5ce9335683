"""Transactional messages, as RocketMQ's TransactionMQProducer uses them: a half message (property
``TRAN_MSG=true``, sysFlag PREPARED) is stored held (store/holds/held_messages.py: written once, in no queue)
and SEND_OK names it; END_TRANSACTION commits it -- then it is indexed into its queue and
delivered -- or rolls it back -- never delivered. A half message whose transaction has not
ended when it is due for a check (``remoting_transaction_timeout_s`` after it was sent, or its
``CHECK_IMMUNITY_TIME_IN_SECONDS``, then every ``remoting_transaction_check_interval_s``) is
asked about with CHECK_TRANSACTION_STATE on a live connection of a producer of its group
(``PGROUP``) that may write its topic (access.py, as an END_TRANSACTION must), whose answer is
an END_TRANSACTION; after ``remoting_transaction_check_max`` checks it is rolled back and
logged. The state is the store's: it survives a restart. RocketMQ 5's gRPC producers end
theirs and are checked through the same service (gateway/rocketmq_grpc/transactions.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.frames import FLAG_ONEWAY, RemotingCommand, response_to
from protocols.remoting.message_codec import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    WireMessage,
    encode_message,
)
from protocols.remoting.properties import PGROUP, TRAN_MSG, TRANSACTION_ID, UNIQ_KEY
from store import MessageStore, StoredMessage, StoreError
from store import Hold
from store import HALF

from ..auth.authorize import Principal
from ..tasks import cancel_and_wait
from .access import RemotingAccess
from .requests import BadRequest, int_field, str_field

if TYPE_CHECKING:
    from .connection import RemotingConnection

log = logging.getLogger("tidemq.remoting")

CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
CHECK_BATCH = 256
_opaques = itertools.count(1 << 30)


def is_half(properties: dict[str, str], sys_flag: int) -> bool:
    """A transaction's half message, as RocketMQ's clients mark one (either mark)."""
    return (properties.get(TRAN_MSG, "").lower() == "true"
            or sys_flag & TRANSACTION_ROLLBACK_TYPE == TRANSACTION_PREPARED_TYPE)


@dataclass(slots=True, frozen=True)
class TransactionSettings:
    """RocketMQ 5's broker defaults (transactionTimeOut, transactionCheckInterval, transactionCheckMax)."""

    timeout_s: float = 6.0  # a half message is first checked this long after it was sent
    check_interval_s: float = 30.0  # then again every this long
    check_max: int = 15  # then it is rolled back


class TransactionNotFound(BadRequest):
    """A transaction's end that names no half message of its producer waiting to be ended."""


class TransactionProducer(Protocol):
    """A live producer a half message's check is sent to: a remoting connection, or a gRPC
    client's telemetry stream."""

    closed: bool
    principal: Principal

    def check_transaction(self, message: StoredMessage, hold: Hold) -> None: ...


class Producers:
    """Live producers by group: remoting connections from their heartbeats (``producerDataSet``),
    gRPC clients' telemetry streams by the topics they publish to (RocketMQ 5's proxy's groups)."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, TransactionProducer]] = {}

    def heartbeat(self, group: str, client_id: str, connection: TransactionProducer) -> None:
        self._groups.setdefault(group, {})[client_id] = connection

    def connection_closed(self, connection: TransactionProducer) -> None:
        for group, members in list(self._groups.items()):
            for client_id in [c for c, conn in members.items() if conn is connection]:
                del members[client_id]
            if not members:
                del self._groups[group]

    def any(self, group: str, may_ask: Callable[[TransactionProducer], bool]) -> TransactionProducer | None:
        """A live connection of the group's producers that ``may_ask``."""
        for connection in (self._groups.get(group) or {}).values():
            if not connection.closed and may_ask(connection):
                return connection
        return None


class TransactionService:
    def __init__(self, store: MessageStore, producers: Producers, settings: TransactionSettings,
                 message_of: Callable[[StoredMessage, str], tuple[WireMessage, str]], access: RemotingAccess) -> None:
        self.store = store
        self.producers = producers
        self.timeout_s = settings.timeout_s
        self.check_interval_s = settings.check_interval_s
        self.check_max = settings.check_max
        # (half message, its store queue) -> the wire message a check carries, its offsetMsgId
        self._message_of = message_of
        self.access = access
        self._task: asyncio.Task[None] | None = None
        self.checks_sent = 0
        self.rolled_back_unchecked = 0
        # (ms) where the half messages' keys are looked up from (store/holds/held_messages.py take_earliest)
        self._checked_to = 0

    def first_check_ms(self, properties: dict[str, str], now_ms: int) -> int:
        immunity = properties.get(CHECK_IMMUNITY)
        try:
            wait_s = float(immunity) if immunity is not None else self.timeout_s
        except ValueError:
            wait_s = self.timeout_s
        return now_ms + int(max(wait_s, 0) * 1000)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="transaction-checks")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    # -- END_TRANSACTION -----------------------------------------------------------------------
    async def end(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        kind = int_field(ext, "commitOrRollback", TRANSACTION_NOT_TYPE) & TRANSACTION_ROLLBACK_TYPE
        position = int_field(ext, "commitLogOffset", -1)
        group = str_field(ext, "producerGroup")
        if kind == TRANSACTION_NOT_TYPE:  # the producer does not know yet: a later check asks again
            return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)
        if kind not in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
            raise BadRequest(f"commitOrRollback {kind} is neither commit (8) nor rollback (12)")
        await self.finish(conn.principal, position, kind == TRANSACTION_COMMIT_TYPE,
                          lambda message: message.properties.get(PGROUP) == group)
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    async def finish(self, who: Principal, position: int, commit: bool, ours: Callable[[StoredMessage], bool]) -> None:
        """Commit or roll back the half message stored at ``position`` (a remoting or gRPC
        producer's end); TransactionNotFound when none waits there, or it is not ``ours`` (its
        producer group, message id); BadRequest when ``who`` may not write it."""
        hold = self.store.held.at(position)
        if hold is None or hold.kind != HALF:
            raise TransactionNotFound("Find prepared transaction message failed")  # (RocketMQ's remark)
        message = self.store.read_at(hold.target)
        if message is None or not ours(message):
            raise TransactionNotFound("The producer group wrong")
        self.access.check_write(who, message, "end_transaction")
        try:
            if commit:
                await self.store.held.release([hold])
            else:
                await self.store.held.discard([hold])
        except StoreError as exc:
            raise BadRequest(f"the transaction's end was not stored: {exc}") from None
        log.debug("transaction ended group=%s position=%d commit=%s", message.properties.get(PGROUP), position, commit)

    # -- checks --------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                await self.check_due()
            except StoreError as exc:
                log.warning("transaction check failed error=%s", exc)
            await asyncio.sleep(min(1.0, self.check_interval_s))

    async def check_due(self) -> None:
        """Ask the producers about the half messages due for a check; roll back those checked
        ``check_max`` times already."""
        held = self.store.held
        now = int(time.time() * 1000)
        earliest = held.take_earliest(HALF)
        if earliest is not None and earliest < self._checked_to:
            self._checked_to = earliest
        due = held.due(HALF, now, CHECK_BATCH, self._checked_to)
        if due:  # every half due before the last of these is checked (moved on) or ended
            self._checked_to = due[-1].due_ms
        for hold in due:
            if hold.checks >= self.check_max:
                await held.discard([hold])
                self.rolled_back_unchecked += 1
                log.warning("transaction rolled back after %d unanswered checks position=%d", hold.checks, hold.target)
                continue
            self._ask(hold)
            held.reschedule(hold, now + int(self.check_interval_s * 1000))

    def _ask(self, hold: Hold) -> None:
        message = self.store.read_at(hold.target)
        if message is None:
            return
        props = message.properties
        producer = self.producers.any(props.get(PGROUP, ""),
                                      lambda connection: self.access.may_write(connection.principal, message))
        if producer is None:  # none connected: counted as a check (RocketMQ's too)
            log.info("no producer to check a transaction group=%s position=%d", props.get(PGROUP), hold.target)
            return
        producer.check_transaction(message, hold)
        self.checks_sent += 1

    def check_over_remoting(self, producer: RemotingConnection, message: StoredMessage, hold: Hold) -> None:
        """Ask a remoting producer about a half message: CHECK_TRANSACTION_STATE, answered by
        an END_TRANSACTION."""
        props = message.properties
        wire, offset_msg_id = self._message_of(message, hold.queues[0])
        # (RocketMQ's CheckTransactionStateRequestHeader, as its Java client reads it)
        header = {"tranStateTableOffset": "0", "commitLogOffset": str(hold.target), "msgId": props.get(UNIQ_KEY, ""),
                  "transactionId": props.get(TRANSACTION_ID) or props.get(UNIQ_KEY, ""),
                  "offsetMsgId": offset_msg_id}
        producer.send(RemotingCommand(code=RequestCode.CHECK_TRANSACTION_STATE, opaque=next(_opaques), flag=FLAG_ONEWAY,
                                      ext_fields=header, body=encode_message(wire)))
        producer.flush_soon()
