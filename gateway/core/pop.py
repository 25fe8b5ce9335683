"""Pop consumption over the store, for any protocol: a consumer group's members take messages
of one queue at once (message-level load balancing: each pop hands out messages no other pop
holds), each invisible for its invisible time; an ack ends it; one not acked in time comes
back (revive), its attempts + 1; past the group's maximum it goes to the caller's dead letter.

The state is store/meta/popstate.py's (pop offset and check points, one WAL batch per change); a
pop reads and records without awaiting in between, so two pops of one queue never overlap.
One revive task per gateway looks every ``LOOK_S`` (sooner when a pop's check point is due
sooner); it never walks the check points to find the next one: acked ones leave tombstones
there, which a walk per pop would step over again and again.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from store import GetResult, GetStatus, MessageStore, StoredMessage, StoreError
from store import RateLimitedLog
from store import now_ms as clock_ms
from store import CheckPoint, PopCheckPoints

from ..tasks import cancel_and_wait
from .pop_order import Ordered, OrderedOut


log = logging.getLogger("tidemq.pop")

REVIVE_BATCH = 1024  # check points revived per WAL batch
LOOK_MS = 200  # the revive task's longest sleep (a pop with a shorter invisible time wakes it)
RETRY_S = 1.0  # after a dead-letter put failed
# revive walks from where it got to, less this (a check point is made due at or after the time
# it is made, so none is missed unless the clock steps back further; a restart walks all)
CLOCK_SLACK_MS = 1000
INIT_MIN, INIT_MAX = 0, 1  # where a group new to a queue starts (RocketMQ's ConsumeInitMode)

# (queue, offset, max messages) -> what a reader of the queue gets (a selector's filtered read)
Reader = Callable[[str, int, int], GetResult]
# (check point, its message, attempts) -> stored into the group's dead letter queue
DeadLetter = Callable[[CheckPoint, StoredMessage, int], Awaitable[None]]


class Admission(enum.Enum):
    """What becomes of a message for the member that pops it."""

    TAKE = "take"  # handed to this member
    LEAVE = "leave"  # not this member's to read, another member's: it waits, ready, for one
    PASS = "pass"  # no member of the group may read it: passed over, as a filtered-out message is


@dataclass(slots=True)
class Popped:
    """What one pop of one queue hands out: the messages (their check points alike, in order)."""

    queue: str
    pop_time_ms: int
    invisible_ms: int
    messages: list[StoredMessage] = field(default_factory=list)
    points: list[CheckPoint] = field(default_factory=list)
    rest: int = 0  # messages left unread past the pop offset
    next_offset: int | None = None  # the pop offset after this pop (None: the queue was not read)

    @property
    def due_ms(self) -> int:
        return self.pop_time_ms + self.invisible_ms


class PopService:
    def __init__(self, store: MessageStore, dead_letter: DeadLetter, max_attempts: Callable[[str], int]) -> None:
        self.store = store
        self.points = PopCheckPoints(store.meta.db, store.meta.writes)
        self.ordered_out = OrderedOut(store, self.points)  # (ordered pops: pop_order.py)
        self._dead_letter = dead_letter
        self._max_attempts = max_attempts  # group -> revivals allowed before the dead letter
        self.on_ready: Callable[[str, str], None] = lambda group, queue: None  # (wake its held pops)
        self._wake_at = 0  # ms: when the revive task looks next (a pop due sooner moves it)
        self._revived_to = 0  # ms: every check point due before this (less the slack) is revived
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # (group, queue, offset) of check points whose dead letter is being stored: an ack or a
        # change of them then would end, or move, what is already on its way to the DLQ
        self._settling: set[tuple[str, str, int]] = set()
        self.revived = 0
        self.dead_lettered = 0
        self._failures = RateLimitedLog(log)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pop-revive")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    # -- pop / ack / change --------------------------------------------------------------------
    def pop(self, group: str, queue: str, max_messages: int, invisible_ms: int, read: Reader,
            admit: Callable[[StoredMessage], Admission] | None = None, init_mode: int = INIT_MIN,
            start: Callable[[], int | None] | None = None, now_ms: int | None = None,
            ordered: Ordered | None = None) -> Popped:
        """Hand out up to ``max_messages`` of ``queue`` to one member of ``group``: revived ones
        first, then new ones from the pop offset (``read`` applies the member's filter; ``admit``
        says, of each, revived or new, whether this member takes it, leaves it ready for another
        member, or the group passes over it). Durable (in the WAL) when it returns. ``start``:
        where a group new to the queue begins (its pull consumer offset), else ``init_mode``.
        ``now_ms``: the pop time (one for the queues of one request: its answer names them all
        by it). ``ordered``: which messages are of an order (pop_order.py), handed out one
        stretch of the queue at a time."""
        now = clock_ms() if now_ms is None else now_ms
        popped = Popped(queue, now, invisible_ms)
        if ordered is not None and self.ordered_out.blocked(group, queue, ordered):
            return popped  # (an ordered message of the queue is out: the rest wait for its end)
        revived = []
        for cp in self.points.ready(group, queue, max_messages):
            message = self.store.read_at(cp.position)
            if message is None:  # retention removed it while it was out
                log.warning("popped message gone before it was acked group=%s queue=%s offset=%d", group, queue, cp.offset)
                self.points.forget(cp)
                continue
            admission = Admission.TAKE if admit is None else admit(message)
            if admission is Admission.PASS:  # (another member popped it before)
                self.points.forget(cp)  # passed over, as a new one would be
                continue
            if admission is Admission.LEAVE:
                continue  # (stays ready)
            message.queue, message.queue_offset = queue, cp.offset
            revived.append(cp)
            popped.messages.append(message)
            popped.points.append(cp)
        new: list[CheckPoint] = []
        left: list[CheckPoint] = []  # new ones another member is to pop: ready at once
        offset = self.points.pop_offset(group, queue)
        moved = offset is None
        if offset is None:
            offset = start() if start is not None else None
            if offset is None:
                # (as RocketMQ's getInitOffset: MIN, else MAX, which starts at the last message there is)
                offset = self.store.min_offset_now(queue) if init_mode == INIT_MIN \
                    else max(0, self.store.max_offset_now(queue) - 1)
        room = max_messages - len(popped.messages)
        result = read(queue, offset, room) if room > 0 else None
        if result is not None:
            if result.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW):
                offset, moved = result.next_offset, True  # retention took them, or the queue is gone
                result = read(queue, offset, room)
            if result.status is GetStatus.FOUND or result.next_offset > offset:
                for message in result.messages:
                    admission = Admission.TAKE if admit is None else admit(message)
                    if admission is Admission.PASS:
                        continue
                    cp = CheckPoint(group, queue, message.queue_offset, message.position, 0)
                    if admission is Admission.LEAVE:
                        left.append(cp)
                        continue
                    new.append(cp)
                    popped.messages.append(message)
                    popped.points.append(cp)
                offset, moved = max(offset, result.next_offset), True
            popped.rest = max(0, result.max_offset - offset)
            popped.next_offset = offset
        if popped.points or moved:
            self.points.popped(group, queue, popped.due_ms, revived, new, offset if moved else None, left)
            self._scheduled(popped.due_ms)
        if ordered is not None:
            for message, cp in zip(popped.messages, popped.points):
                if ordered(message):
                    self.ordered_out.handed_out(cp, popped.due_ms)
        if left:
            self.on_ready(group, queue)
        return popped

    def ack(self, group: str, queue: str, offset: int, due_ms: int) -> CheckPoint | None:
        """End a popped message's check point (named by its pop's due time); None when it is
        gone: acked already, or revived (the message comes, or came, back)."""
        cp = self.points.invisible(group, queue, offset, due_ms)
        if cp is None or (group, queue, offset) in self._settling:
            return None
        self.points.ack([cp])
        if self.ordered_out.holds(group, queue, offset):
            self.on_ready(group, queue)  # (the rest of its order may go now)
        return cp

    def ack_many(self, group: str, queue: str, offsets: list[int], due_ms: int) -> list[CheckPoint]:
        """``ack`` for several messages of one pop, one batch; those that were still out."""
        points = [cp for cp in (self.points.invisible(group, queue, o, due_ms) for o in offsets)
                  if cp is not None and (group, queue, cp.offset) not in self._settling]
        if points:
            self.points.ack(points)
            if any(self.ordered_out.holds(group, queue, cp.offset) for cp in points):
                self.on_ready(group, queue)
        return points

    def change(self, group: str, queue: str, offset: int, due_ms: int, invisible_ms: int) -> int | None:
        """Make a popped message invisible for ``invisible_ms`` from now instead; the new pop
        time, or None when its check point is gone."""
        cp = self.points.invisible(group, queue, offset, due_ms)
        if cp is None or (group, queue, offset) in self._settling:
            return None
        now = clock_ms()
        self.points.change(cp, now + invisible_ms)
        self.ordered_out.changed(group, queue, offset, now + invisible_ms)
        self._scheduled(now + invisible_ms)
        return now

    def outstanding(self, group: str | None = None) -> list[CheckPoint]:
        return [cp for cp in self.points.outstanding() if group is None or cp.group == group]

    # -- revive --------------------------------------------------------------------------------
    def _scheduled(self, due_ms: int) -> None:
        if due_ms < self._wake_at:
            self._wake_at = due_ms
            self._wake.set()

    async def revive_due(self) -> int:
        """Revive what is due now: into the ready set, or past its group's maximum, the dead
        letter. How many were handled."""
        now = clock_ms()
        start = max(0, self._revived_to - CLOCK_SLACK_MS)
        due = self.points.due(now, REVIVE_BATCH, start)
        reached = now if len(due) < REVIVE_BATCH else due[-1].due_ms
        if not due:
            self._revived_to = reached
            return 0
        back: list[CheckPoint] = []
        dead: list[CheckPoint] = []
        for cp in due:
            (dead if cp.attempts + 1 > self._max_attempts(cp.group) else back).append(cp)
        if back:
            self.points.revive(back)
            self.revived += len(back)
            for owner in {(cp.group, cp.queue) for cp in back}:
                self.on_ready(*owner)
        for cp in dead:
            await self._bury(cp, cp.attempts + 1)
        self._revived_to = reached  # (not when a dead letter failed: it is walked again)
        return len(due)

    async def dead_letter(self, group: str, queue: str, offset: int, due_ms: int) -> bool:
        """Move a popped message out now into its group's dead letter, as one past its
        attempts (a consumer gave up on it); False when its check point is gone."""
        cp = self.points.invisible(group, queue, offset, due_ms)
        if cp is None or (group, queue, offset) in self._settling:
            return False
        await self._bury(cp, cp.attempts + 1)
        return True

    async def _bury(self, cp: CheckPoint, attempts: int) -> None:
        """The check point's message into the dead letter, then the check point ended."""
        message = self.store.read_at(cp.position)
        if message is not None:
            message.queue, message.queue_offset = cp.queue, cp.offset
            settling = (cp.group, cp.queue, cp.offset)
            self._settling.add(settling)
            try:
                await self._dead_letter(cp, message, attempts)  # (a crash before the ack: twice)
            finally:
                self._settling.discard(settling)
            self.dead_lettered += 1
        else:
            log.warning("popped message gone before its dead letter group=%s queue=%s offset=%d",
                        cp.group, cp.queue, cp.offset)
        self.points.ack([cp])
        if self.ordered_out.holds(cp.group, cp.queue, cp.offset):
            self.on_ready(cp.group, cp.queue)

    async def _run(self) -> None:
        while True:
            try:
                if await self.revive_due():
                    continue  # more may be due
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- a store refusal, or a dead letter that cannot be put: again later
                self._failures.log(logging.WARNING, type(exc).__name__, "pop revive failed; retried error=%s", exc,
                                   exc_info=not isinstance(exc, StoreError))
                await asyncio.sleep(RETRY_S)
                continue
            self._wake_at = clock_ms() + LOOK_MS
            while (delay := (self._wake_at - clock_ms()) / 1000) > 0:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except TimeoutError:
                    pass

