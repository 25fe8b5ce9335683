"""The node's MQTT state: sessions by client id, live connections, wildcard queues, retained
messages, wills, and the notify listener that wakes the connections reading a queue.

Connections (connection.py) speak the protocol; this module owns what outlives them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from cache import QueueCache
from protocols.mqtt.packets import Publish, Will
from store import PutResult, StoredMessage, StoreError
from store import RateLimitedLog

from ..core.group import group_start
from ..deadlines import Deadlines, StalledReads
from ..interop import queue_for_filter
from ..ports import MQTTPorts
from ..stats import ProtocolStats
from ..tasks import all_done, cancel_and_wait
from .expiry import SessionExpiry
from .ingest_gate import IngestGate
from .messages import DeliveryMemo, StoreMessageFactory
from .presence import PRESENCE_FILTER, PRESENCE_HOLDER, Presence
from .session import Session
from .session_saves import SessionSaves
from .settings import MQTTSettings
from .share_refusal import SharedRefusal
from .shared import ShareGroup
from .sys_topics import publish_sys_topics

if TYPE_CHECKING:
    from ..auth.authorize import MqttAccess
    from ..auth.passwords import PasswordFile
    from ..pressure import StorePressure
    from .connection import MQTTConnection

log = logging.getLogger("tidemq.mqtt")


class Reader(Protocol):
    """A reader of queues that a notify wakes (``wake``): a connection's delivery
    (``outbound.Delivery``), a shared group (``shared.ShareGroup``)."""

    def schedule_pump(self) -> None: ...

    def pump(self) -> None: ...


class MQTTBroker:
    """``ports``: the store, the session repository, the filters, the retained messages and
    the reads, as this kind of node implements them (gateway/ports.py). ``node``: this node's
    name in ``$SYS/brokers/{node}/...``."""

    def __init__(self, ports: MQTTPorts, settings: MQTTSettings, *, cache: QueueCache,
                 authenticator: PasswordFile | None = None, acl: MqttAccess | None = None,
                 pressure: StorePressure | None = None, node: str = "tidemq") -> None:
        self.store = ports.store
        self.stored_sessions = ports.sessions
        self.wildcards = ports.filters
        self.retained = ports.retained
        self.reads = ports.reads
        self.pressure = pressure
        self.settings = settings
        self.cache = cache
        self.deliveries = DeliveryMemo()  # one Delivery per cached message object, for every reader
        self.deadlines = Deadlines()  # the connections' connect timeouts and keep-alives
        self.stalled = StalledReads(settings.read_timeout_s)  # connections silent in the middle of a packet
        self.authenticator = authenticator
        self.acl = acl
        self.sessions: dict[str, Session] = {}
        self.connections: dict[str, MQTTConnection] = {}
        self.readers: dict[str, set[Reader]] = {}  # queue -> who reads it here (a connection's delivery, a group)
        self.share_groups: dict[str, ShareGroup] = {}  # "$share/{group}/{filter}" -> group
        # restored sessions holding shared deliveries, by group, until the group is made again
        self._restored_shares: dict[str, list[Session]] = {}
        self.shared_refusal = SharedRefusal(ports.shared_refusal)
        self.stats = ProtocolStats()
        self.limited_log = RateLimitedLog(log)  # failures that repeat per publish (a full disk)
        self.started_at = time.time()
        # when sessions are written, and the output that waits for it (write-ahead)
        self.saves = SessionSaves(self.stored_sessions, self.sessions, settings.progress_save_interval_s,
                                  self._session_saved)
        self._woken: list[Reader] = []  # readers whose pump runs next (wake)
        self.gate = IngestGate()  # publishers wait while subscribers with full sockets catch up
        self._pending_wills: dict[str, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._running = False  # between start() and stop(): notify events are acted on
        self.presence = Presence(node, settings.presence_events, self._put_presence, self.limited_log)

    # -- lifecycle -----------------------------------------------------------------------------
    def _resource_alarm(self, reason: str | None) -> None:
        for conn in list(self.connections.values()):
            conn.resource_alarm(reason)

    async def start(self) -> None:
        if self.pressure is not None:
            self.pressure.on_change(self._resource_alarm)
        for client_id, raw in self.stored_sessions.stored():  # (a gateway node's: none)
            session = self.restore_session(client_id, raw)
            if session is not None:
                for sub in session.subscriptions.values():
                    self.hold_filter(session, sub.topic_filter)
                for key in session.shares_held():
                    self._restored_shares.setdefault(key, []).append(session)
        self.retained.load()
        if self.presence.enabled:  # its wildcard queue has every event from now on (presence.py)
            self.wildcards.hold(PRESENCE_FILTER, PRESENCE_HOLDER, True)
        self._running = True
        # heard as each commit is published (no task between a commit and the pump it wakes:
        # a delivery goes out in the committer's turn, before the commit's fdatasync is asked for)
        self.store.listen_notify(self._on_notify)
        self._tasks.append(asyncio.get_running_loop().create_task(self._expiry_loop(), name="mqtt-expiry"))
        if self.settings.sys_interval_s > 0:
            self._tasks.append(asyncio.get_running_loop().create_task(publish_sys_topics(self), name="mqtt-sys"))
        log.info("mqtt sessions restored count=%d retained=%d", len(self.sessions), len(self.retained))

    async def stop(self) -> None:
        self._running = False
        self.store.unlisten_notify(self._on_notify)
        for conn in list(self.connections.values()):
            conn.shutdown()
        for handle in self._pending_wills.values():
            handle.cancel()
        await cancel_and_wait(self._tasks)
        self.presence.put_all()  # (the disconnected events: stored before the store closes)
        now = time.time()
        for session in self.sessions.values():
            if session.persistent:
                if session.disconnected_at is None:
                    session.disconnected_at = now
                try:
                    self.stored_sessions.put(session.client_id, session.to_json())
                except StoreError as exc:  # (the last save stands: what was read since is read again)
                    self.limited_log.log(logging.ERROR, type(exc).__name__,
                                         "session not saved at stop client_id=%s error=%s", session.client_id, exc)
        self.saves.stop()
        self.deadlines.close()
        self.stalled.close()

    # -- sessions ------------------------------------------------------------------------------
    def restore_session(self, client_id: str, raw: bytes) -> Session | None:
        """A stored session back in ``sessions`` (None: unreadable or expired, and deleted)."""
        now = time.time()
        try:
            session = Session.from_json(client_id, raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("unreadable session dropped client_id=%s error=%s", client_id, exc)
            self.stored_sessions.delete(client_id)
            return None
        if session.disconnected_at is None:
            session.disconnected_at = now  # it was connected when its gateway stopped
        if session.expired(now):
            self.stored_sessions.delete(client_id)
            return None
        self.sessions[client_id] = session
        return session

    def reload_session(self, client_id: str, raw: bytes | None) -> None:
        """What memory holds of ``client_id``'s session is replaced by the stored one (another
        node may have had the client since)."""
        self.sessions.pop(client_id, None)
        if raw is not None:
            self.restore_session(client_id, raw)

    async def claim_session(self, client_id: str) -> None:
        """``client_id`` connects here: its session, as the repository has it, is in
        ``sessions`` when this returns, and what its shared groups start from is at hand."""
        await self.stored_sessions.claim(client_id, self.reload_session)
        session = self.sessions.get(client_id)
        if session is not None:
            taken = self.shared_refusal.take_from(session)
            for state in taken:
                self.release_filter(session, state.topic_filter)
            if taken:
                self.mark_dirty(session)
            groups = [(key, state.queue) for key, state in session.subscriptions.items()
                      if state.share_group is not None and key not in self.share_groups]
            if groups:
                await self.reads.prepare_groups(groups)

    def hold_filter(self, session: Session, topic_filter: str) -> None:
        """``session`` subscribes to ``topic_filter``: a wildcard filter's queue gets writes."""
        self.wildcards.hold(topic_filter, session.client_id, session.persistent)

    def release_filter(self, session: Session, topic_filter: str) -> None:
        self.wildcards.release(topic_filter, session.client_id)

    def mark_dirty(self, session: Session, *, holds_output: bool = True) -> None:
        """Write the session at the end of this turn; its connection's output waits for the write
        unless ``holds_output`` is False (session_saves.py)."""
        self.saves.mark_dirty(session, holds_output=holds_output)

    def mark_progress(self, session: Session) -> None:
        """Write the session's read progress within ``progress_save_interval_s`` (session_saves.py)."""
        self.saves.mark_progress(session)

    def flush_sessions(self) -> None:
        """Write the sessions changed so far now (a client leaves: another node may load it next)."""
        self.saves.flush()

    def _session_saved(self, client_id: str) -> None:
        if not self.stored_sessions.keeps_offline and client_id not in self.connections \
                and client_id not in self._pending_wills:
            self.sessions.pop(client_id, None)  # stored: whichever node its client comes back to loads it

    def end_session(self, session: Session) -> None:
        """Forget a session: its stored state, then its shared deliveries, its subscriptions, its
        wildcard references. StoreError: the stored state could not be deleted, and nothing
        changed (else it would come back at the next start)."""
        self.stored_sessions.delete(session.client_id)
        self.end_shared(session)
        self.sessions.pop(session.client_id, None)
        for sub in session.subscriptions.values():
            self.release_filter(session, sub.topic_filter)
        session.subscriptions.clear()
        self.saves.forget(session.client_id)
        handle = self._pending_wills.pop(session.client_id, None)
        if handle is not None:  # the session ends before the will delay: publish it now
            handle.cancel()
            if session.will is not None:
                self.publish_will(session.client_id, session.will)

    async def _expiry_loop(self) -> None:
        await SessionExpiry(self._absent_sessions, self.end_session).run(self.settings.expiry_check_interval_s)

    def _absent_sessions(self) -> list[Session]:
        """The sessions in memory whose client is not connected (a will may be pending)."""
        return [s for s in self.sessions.values() if s.client_id not in self.connections]

    # -- wills ---------------------------------------------------------------------------------
    def schedule_will(self, session: Session, will: Will, delay: int) -> None:
        if delay <= 0:
            self.publish_will(session.client_id, will)
            return
        session.will = will
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._pending_wills.pop(session.client_id, None)
            session.will = None
            self.publish_will(session.client_id, will)

        self._pending_wills[session.client_id] = loop.call_later(delay, fire)

    def cancel_will(self, client_id: str) -> None:
        handle = self._pending_wills.pop(client_id, None)
        if handle is not None:
            handle.cancel()
        session = self.sessions.get(client_id)
        if session is not None:
            session.will = None

    def publish_will(self, client_id: str, will: Will) -> None:
        """Publish a will (its topic was checked against the ACL when the client connected)."""
        publish = Publish(will.topic, will.payload, will.qos, will.retain,
                          properties=will.properties.copy(will_delay_interval=None))
        self._put([(publish, client_id)])

    def publish_internal(self, messages: list[tuple[str, bytes]], *, retain: bool = False) -> None:
        """Messages the broker itself publishes ($SYS statistics)."""
        self._put([(Publish(topic, payload, 0, retain), "") for topic, payload in messages])

    def _put_presence(self, events: list[tuple[str, bytes]]) -> asyncio.Future[Sequence[PutResult]]:
        # (QoS 1: a persistent subscriber's session keeps them; failures: the presence module logs them)
        return self._put([(Publish(topic, body, 1, False), "") for topic, body in events], logged=False)

    def publish(self, publishes: list[Publish], client_id: str) -> asyncio.Future[Sequence[PutResult]]:
        """Messages published on behalf of ``client_id`` by something that is not an MQTT
        connection (the data API's ``POST /data/publish``): stored, retained and delivered
        exactly as if that client had published them. Resolves when they are durable."""
        return self._put([(p, client_id) for p in publishes])

    def _put(self, publishes: list[tuple[Publish, str]], *, logged: bool = True) -> asyncio.Future[Sequence[PutResult]]:
        factories: dict[str, StoreMessageFactory] = {}
        items = []
        for p, client_id in publishes:
            factory = factories.get(client_id)
            if factory is None:
                factory = factories[client_id] = StoreMessageFactory(client_id)
            items.append((factory.message(p, p.topic), self.wildcards.queues_for(p.topic)))
        fut = self.store.put_batch_nowait(items)
        if any(p.retain for p, _ in publishes):
            fut = self._retained_after(fut, [(p.topic, bool(p.payload)) if p.retain else None for p, _ in publishes])
        if logged:
            fut.add_done_callback(_log_failure)
        return fut

    # -- retained messages ---------------------------------------------------------------------
    def record_retained(self, entries: list[tuple[str, bool] | None], fut: asyncio.Future,
                        settling: list[Awaitable[None]]) -> tuple[int, StoreError] | None:
        """Done-callback of a put: remember (or clear, for an empty payload) the retained
        messages among the stored ones; ``entries`` lines up with the put's messages. When one
        could not be written: its index and the error (neither it nor those after it are retained).
        What the acknowledgement must wait for (``RetainedStore.set``) is added to ``settling``."""
        if fut.cancelled() or fut.exception() is not None:
            return None
        for i, (entry, result) in enumerate(zip(entries, fut.result())):
            if entry is not None:
                topic, keep = entry
                try:
                    waiting = self.set_retained(topic, result.position if keep else None)
                    if waiting is not None:
                        settling.append(waiting)
                except StoreError as exc:
                    self.limited_log.log(logging.ERROR, type(exc).__name__, "retained message not recorded topic=%s error=%s",
                                         topic, exc)
                    return i, exc
        return None

    def _retained_after(self, put: asyncio.Future[Sequence[PutResult]], entries: list[tuple[str, bool] | None]
                        ) -> asyncio.Future[Sequence[PutResult]]:
        """``put``'s outcome once its retained messages are recorded: StoreError when one could
        not be (the messages are stored; the caller retries, as an MQTT client would)."""
        done: asyncio.Future[Sequence[PutResult]] = asyncio.get_running_loop().create_future()

        def recorded(f: asyncio.Future[Sequence[PutResult]]) -> None:
            settling: list[Awaitable[None]] = []
            if f.cancelled():
                done.cancel()
            elif (exc := f.exception()) is not None:
                done.set_exception(exc)
            elif (failed := self.record_retained(entries, f, settling)) is not None:
                done.set_exception(failed[1])
            elif settling:
                def settled(s: asyncio.Future[None]) -> None:
                    failure = s.exception()
                    if failure is not None:
                        done.set_exception(failure)
                    else:
                        done.set_result(f.result())
                asyncio.ensure_future(all_done(settling)).add_done_callback(settled)
            else:
                done.set_result(f.result())

        put.add_done_callback(recorded)
        return done

    def set_retained(self, topic: str, position: int | None) -> Awaitable[None] | None:
        return self.retained.set(topic, position)

    def retained_matching(self, topic_filter: str) -> list[StoredMessage]:
        return self.retained.matching(topic_filter)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """A background task of the broker's (cancelled when it stops)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    async def read_positions(self, positions: Iterable[int]) -> dict[int, StoredMessage | None]:
        """Messages by commitlog position, None for one retention removed -- never for one
        merely not at hand (StoreError when that cannot be known now)."""
        return await self.reads.read_positions(positions)

    # -- shared subscriptions ------------------------------------------------------------------
    def share_group(self, group: str, topic_filter: str) -> ShareGroup:
        key = f"$share/{group}/{topic_filter}"
        found = self.share_groups.get(key)
        if found is None:
            start = group_start(self.store, key, queue_for_filter(topic_filter), resume=True)
            found = self.share_groups[key] = ShareGroup(self, group, topic_filter, start,
                                                        self._restored_shares.pop(key, ()))
        return found

    def end_shared(self, session: Session) -> None:
        """``session`` ends with shared deliveries of its own (kept while its client was away:
        QoS 2 ones whose PUBREC came, or what a restart gave back to it): what its groups still
        count as its own goes to another member (``ShareGroup.session_ended``)."""
        for inflight in list(session.inflight.values()):
            state = session.subscriptions.get(inflight.share) if inflight.share is not None else None
            if state is not None and state.share_group is not None and not inflight.released:
                self.share_group(state.share_group, state.topic_filter).session_ended(session, inflight)

    def join_share(self, key: str, conn: MQTTConnection) -> None:
        state = conn.delivery.shared_subscription(key)
        assert state is not None and state.share_group is not None
        group = self.share_group(state.share_group, state.topic_filter)
        group.join(conn)
        self.add_reader(group.queue, group)

    def leave_share(self, key: str, conn: MQTTConnection, unacked: list[tuple[int, int]]) -> None:
        """``unacked``: (queue offset, commitlog position) of what ``conn`` did not acknowledge."""
        group = self.share_groups.get(key)
        if group is None:
            return
        group.leave(conn, unacked)
        if not group.members:
            self.remove_reader(group.queue, group)
            if group.idle:  # its committed offset (saved) is all of it: kept, groups would pile up
                del self.share_groups[key]

    # -- readers and notify --------------------------------------------------------------------
    def reads_queue(self, queue: str) -> bool:
        """Whether anything here reads the store queue (a reader: store/retention/reclaim.py): a subscription
        or hold of its filter, a connection or group at it, or a shared-subscription group kept
        (or restored) with deliveries its members did not acknowledge: its cursor is there."""
        if self.wildcards.reads(queue) or queue in self.readers:
            return True
        shares = [*self.share_groups, *self._restored_shares] if self.share_groups or self._restored_shares else ()
        return any(queue_for_filter(key.split("/", 2)[2]) == queue for key in shares)

    def add_reader(self, queue: str, reader: Reader) -> None:
        readers = self.readers.get(queue)
        if readers is None:
            readers = self.readers[queue] = set()
            self.reads.reading(queue)
        readers.add(reader)

    def reader_count(self, queue: str) -> int:
        return len(self.readers.get(queue, ()))

    def remove_reader(self, queue: str, conn: Reader) -> None:
        readers = self.readers.get(queue)
        if readers is not None:
            readers.discard(conn)
            if not readers:
                del self.readers[queue]
                self.cache.drop(queue)
                self.reads.not_reading(queue)

    def _on_notify(self, events: dict[str, int]) -> None:
        """A commit's ``{queue: max offset}``, heard inside the store's dispatch: the readers of
        those queues are pumped once the commit is complete (``wake``), not here."""
        if not self._running:
            return
        all_readers = self.readers
        for queue in events:
            readers = all_readers.get(queue)
            if readers:
                for reader in readers:  # (the queue cache heard of the event first, by itself)
                    reader.schedule_pump()

    def wake(self, reader: Reader) -> None:
        """Run ``reader.pump()`` soon (the reader keeps its own "already woken" flag): woken by a
        commit's notify, as that commit completes, in the committer's turn; otherwise on the
        loop's next turn. One callback pumps every reader woken meanwhile: a notify that wakes
        a thousand subscribers costs one callback, not a thousand."""
        if not self._woken:
            self.store.after_commit(self._pump_woken)
        self._woken.append(reader)

    def _pump_woken(self) -> None:
        woken, self._woken = self._woken, []
        for reader in woken:
            try:
                reader.pump()
            except Exception:  # one reader's failure must not keep the others waiting
                log.exception("pump failed reader=%r", reader)


def _log_failure(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("broker publish not stored error=%s", fut.exception())

