"""The replication link over asyncio streams: the leader's service that streams its commitlog to
each follower and keeps the confirmed position, and the follower's client that writes what it
receives and acknowledges it.

Who is in sync is not decided here: ``InSyncSet`` is the group's record (etcd in a cluster, the
process in tests), changed by compare-and-swap. The leader drops a follower that has been behind
for ``lag_s`` from it before the confirmed position moves on without that follower, and adds a
follower back once it holds everything confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import StoreError
from ..log.commitlog import CommitLog
from .follower import FollowerLog
from .leader import LeaderLog, confirmed_position
from .seed import SeedWriter, Snapshot
from .wire import Ack, Data, FrameReader, Hello, Refuse, SeedDone, SeedFile, Welcome, WireError, encode

log = logging.getLogger("tidemq.store.replica")

CHUNK = 1 << 20  # bytes per DATA frame at most
HEARTBEAT_S = 0.2
INDEX_EVERY_S = 0.005  # a follower indexes what was confirmed at most this often
SILENCE_S = 1.0  # a follower ends a link on which its leader sent nothing this long (stopped, cut off)


class InSyncSet:
    """The group's in-sync followers, as its record holds them. ``replace`` is a compare-and-swap
    in a cluster; here, the process's own copy (one leader, tests)."""

    def __init__(self, members: frozenset[str] = frozenset()) -> None:
        self.members = members

    async def replace(self, old: frozenset[str], new: frozenset[str]) -> bool:
        if self.members != old:
            return False
        self.members = new
        return True


@dataclass(slots=True)
class _Follower:
    node: str
    position: int = 0  # what it holds under the flush policy
    written: int = 0
    behind_since: float | None = None  # monotonic time it last fell behind the leader's end
    connected: bool = True
    writer: asyncio.StreamWriter | None = field(default=None, repr=False)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event, repr=False)  # the leader's log grew


class LeaderService:
    """Streams the commitlog to followers; ``confirmed`` is what every in-sync replica holds.
    ``own_position()``: the leader's own position under the flush policy; ``on_confirmed``:
    told each new confirmed position and whether ``min_insync`` replicas hold it (the committer
    shows what is confirmed, and acknowledges it only when enough replicas hold it)."""

    def __init__(self, leader: LeaderLog, commitlog: CommitLog, in_sync: InSyncSet, *, min_insync: int,
                 own_position: Callable[[], int], durable_acks: bool, lag_s: float = 2.0,
                 on_confirmed: Callable[[int, bool], None] | None = None,
                 on_in_sync: Callable[[frozenset[str]], None] | None = None,
                 snapshot: Callable[[], Snapshot] | None = None) -> None:
        self.leader = leader
        self._log = commitlog
        self.in_sync = in_sync
        self.min_insync = min_insync
        self._own_position = own_position
        self._durable_acks = durable_acks
        self.lag_s = lag_s
        self._on_confirmed = on_confirmed
        self._on_in_sync = on_in_sync
        self._snapshot = snapshot  # the leader's files, to seed a follower it cannot stream to
        self.seeds_sent = 0
        self.followers: dict[str, _Follower] = {}
        self.confirmed = 0 if min_insync > 1 else own_position()
        self.acknowledged = self.confirmed  # the confirmed position when min_insync replicas held it
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # one per follower link
        self._links: dict[asyncio.Task[None], asyncio.StreamWriter] = {}  # each link's writer, to end it
        self._stopping = False
        self._lag: asyncio.Task[None] | None = None
        self._changing = False
        self._joining: frozenset[str] = frozenset()  # followers the set is being changed to take

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        self._lag = asyncio.get_running_loop().create_task(self._watch_lag(), name="replica-lag")
        if self._on_in_sync is not None:
            self._on_in_sync(self.in_sync.members)
        self.recompute()  # (alone in sync: what it holds is confirmed now)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._stopping = True
        if self._lag is not None:
            self._lag.cancel()
        for writer in self._links.values():
            writer.close()  # (its link's task sees the end and returns)
        await asyncio.gather(*(t for t in (self._lag, *self._tasks) if t is not None), return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def written(self) -> None:
        """The commitlog grew (the committer, after each write); the own position may have too."""
        for follower in self.followers.values():
            follower.wakeup.set()
        self.recompute()

    def recompute(self) -> None:
        confirmed, enough = confirmed_position(self._own_position(), {n: f.position for n, f in self.followers.items()},
                                               self.in_sync.members, self.min_insync, self._joining)
        if confirmed > self.confirmed or enough and confirmed > self.acknowledged:
            self.confirmed = max(self.confirmed, confirmed)
            if enough:
                self.acknowledged = confirmed
            if self._on_confirmed is not None:
                self._on_confirmed(confirmed, enough)

    # -- one follower ------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._stopping:
            writer.close()
            return
        self._tasks.add(task)
        self._links[task] = writer
        frames = FrameReader()
        follower: _Follower | None = None
        try:
            hello = await _read_one(reader, frames)
            if not isinstance(hello, Hello):
                raise WireError("a follower starts with HELLO")
            answer = self.leader.welcome(hello)
            if isinstance(answer, Refuse):
                writer.write(encode(answer))
                await writer.drain()
                log.warning("follower refused node=%s reason=%s", hello.node, answer.reason)
                return
            if self.leader.needs_seed(answer):
                await self._seed(hello.node, writer)
                return
            writer.write(encode(answer))
            await writer.drain()
            follower = self.followers.get(hello.node) or _Follower(hello.node)
            if follower.writer is not None:
                follower.writer.close()  # (a reconnect: the older link is dead or about to be)
            follower.writer, follower.connected = writer, True
            follower.position = follower.written = answer.agreed_end
            self.followers[hello.node] = follower
            log.info("follower joined node=%s from=%d epoch=%d", hello.node, answer.agreed_end, answer.epoch)
            sender = asyncio.get_running_loop().create_task(self._send(follower, writer, answer.agreed_end))
            try:
                await self._receive(follower, reader, frames)
            finally:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await sender
        except (ConnectionError, asyncio.IncompleteReadError, WireError) as exc:
            log.info("follower link ended node=%s reason=%s", follower.node if follower else "?", exc)
        finally:
            if follower is not None and follower.writer is writer:
                follower.connected, follower.writer = False, None
            writer.close()
            self._tasks.discard(task)
            self._links.pop(task, None)

    async def _seed(self, node: str, writer: asyncio.StreamWriter) -> None:
        """Send the follower this store's files (replica/seed.py) and end the link: it installs
        them and says HELLO again, from the seed's end."""
        if self._snapshot is None:
            writer.write(encode(Refuse("the follower must be seeded and this leader cannot")))
            await writer.drain()
            return
        seed = self._snapshot()
        started, sent = time.monotonic(), 0
        log.info("seeding follower node=%s files=%d end=%d", node, len(seed.files), seed.end)
        try:
            for name, path, size in seed.files:
                with open(path, "rb") as fh:
                    offset = 0
                    while offset < size or offset == 0:
                        data = fh.read(min(CHUNK, size - offset))
                        writer.write(encode(SeedFile(name, offset, data)))
                        offset += len(data)
                        sent += len(data)
                        await writer.drain()
                        if not data:
                            break
            writer.write(encode(SeedDone(self.leader.epoch, seed.end)))
            await writer.drain()
        finally:
            seed.discard()
        self.seeds_sent += 1
        seconds = time.monotonic() - started
        log.info("follower seeded node=%s bytes=%d seconds=%.2f mb_per_s=%.0f", node, sent, seconds,
                 sent / 1e6 / max(seconds, 1e-6))

    async def _send(self, follower: _Follower, writer: asyncio.StreamWriter, position: int) -> None:
        wakeup = follower.wakeup
        sent_confirmed, heartbeat = -1, True
        while True:
            wakeup.clear()
            data = self.leader.next_data(position, self.confirmed, CHUNK)
            # an empty frame only when it says something: a newer confirmed position, or a
            # heartbeat (not after each DATA frame: the follower answers every frame)
            if data.payload or heartbeat or data.confirmed != sent_confirmed:
                writer.write(encode(data))
                sent_confirmed, heartbeat = data.confirmed, False
            if data.payload:
                position = data.position + len(data.payload)
                if writer.transport.get_write_buffer_size() > 4 * CHUNK:
                    await writer.drain()
                continue
            await writer.drain()
            try:  # (asyncio.timeout: wait_for can swallow a cancel)
                async with asyncio.timeout(HEARTBEAT_S):
                    await wakeup.wait()
            except TimeoutError:
                heartbeat = True

    async def _receive(self, follower: _Follower, reader: asyncio.StreamReader, frames: FrameReader) -> None:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                raise ConnectionError("follower closed the link")
            frames.feed(chunk)
            for frame in frames.frames():
                if not isinstance(frame, Ack):
                    raise WireError(f"a follower sends ACK frames, not {type(frame).__name__}")
                follower.written = frame.written
                follower.position = frame.durable if self._durable_acks else frame.written
            end = self._log.end_position
            if follower.position >= end:
                follower.behind_since = None
            elif follower.behind_since is None:
                follower.behind_since = time.monotonic()
            self.recompute()
            if follower.node not in self.in_sync.members and follower.position >= self.confirmed:
                await self._change(lambda members: members | {follower.node})

    async def _watch_lag(self) -> None:
        while True:
            await asyncio.sleep(self.lag_s / 4)
            now = time.monotonic()
            end = self._log.end_position
            lagging = set()
            for node in self.in_sync.members:
                follower = self.followers.get(node)
                if follower is None:  # in sync under the last leader, not heard from since
                    follower = self.followers[node] = _Follower(node, connected=False)
                if follower.position >= end:
                    continue
                if follower.behind_since is None:
                    follower.behind_since = now
                elif now - follower.behind_since >= self.lag_s or not follower.connected and \
                        now - follower.behind_since >= self.lag_s / 2:
                    lagging.add(node)
            if lagging:
                log.warning("followers out of sync nodes=%s", sorted(lagging))
                await self._change(lambda members: members - lagging)
                self.recompute()

    async def _change(self, edit: Callable[[frozenset[str]], frozenset[str]]) -> None:
        if self._changing:
            return
        self._changing = True
        try:
            old = self.in_sync.members
            new = edit(old)
            self._joining = new - old  # (held to what they hold from now: once added, they may lead)
            if new != old and await self.in_sync.replace(old, new):
                log.info("in-sync set changed members=%s", sorted(new))
                if self._on_in_sync is not None:
                    self._on_in_sync(new)
        finally:
            self._joining = frozenset()
            self._changing = False


class FollowerService:
    """Follows the leader at ``address()`` (asked again at each reconnect); writes, indexes and
    acknowledges what it sends. ``flush``: make the commitlog durable before acknowledging it
    as held (the ``sync`` flush policy)."""

    def __init__(self, follower: FollowerLog, commitlog: CommitLog, node: str, address: Callable[[], tuple[str, int] | None],
                 *, token: str = "", flush: bool, on_error: Callable[[BaseException], Awaitable[None]] | None = None,
                 data_dir: Path | None = None, on_seeded: Callable[[], None] | None = None) -> None:
        self.follower = follower
        self._log = commitlog
        self.node = node
        self._address = address
        self._token = token
        self._flush = flush
        self._on_error = on_error
        self.connected = asyncio.Event()
        self.refused: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._data_dir = data_dir  # where a seed is written (None: this follower cannot be seeded)
        self._on_seeded = on_seeded  # a seed is complete: the store must be opened again to use it
        self._writer: asyncio.StreamWriter | None = None  # the current link's

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="replica-follower")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        delay = 0.05
        while True:
            address = self._address()
            if address is not None:
                try:
                    if await self._follow(*address):
                        return  # seeded: the owner opens the store again and follows anew
                    delay = 0.05
                except (OSError, asyncio.IncompleteReadError, WireError) as exc:
                    log.info("replication link to the leader ended address=%s:%d reason=%s", *address, exc)
                except StoreError as exc:
                    log.error("replication stopped error=%s", exc)
                    if self._on_error is not None:
                        await self._on_error(exc)
                    return
                finally:
                    self.connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def relink(self) -> None:
        """The group has another leader: end the current link (the next one asks ``address()``)."""
        if self._writer is not None:
            self._writer.close()

    async def _follow(self, host: str, port: int) -> bool:
        """Follow until the link ends; True when it ended with a complete seed."""
        reader, writer = await asyncio.open_connection(host, port)
        self._writer = writer
        try:
            frames = FrameReader()
            writer.write(encode(self.follower.hello(self.node, self._token)))
            answer = await _read_within(reader, frames)
            if isinstance(answer, SeedFile):
                return await self._take_seed(answer, reader, frames)
            if isinstance(answer, Refuse):
                self.refused = answer.reason
                raise WireError(f"refused: {answer.reason}")
            if not isinstance(answer, Welcome):
                raise WireError("a leader answers HELLO with WELCOME or REFUSE")
            self.refused = None
            self.follower.welcome(answer)
            self.connected.set()
            loop = asyncio.get_running_loop()
            indexed_at = loop.time()
            while True:
                ready = frames.frames()
                if not ready:
                    try:  # (the leader sends at least a heartbeat every HEARTBEAT_S; asyncio.timeout,
                        # not wait_for, which in 3.11 can swallow a cancel that comes as the read ends)
                        async with asyncio.timeout(SILENCE_S):
                            chunk = await reader.read(1 << 20)
                    except TimeoutError:
                        raise ConnectionError(f"the leader sent nothing for {SILENCE_S} s") from None
                    if not chunk:
                        raise ConnectionError("the leader closed the link")
                    frames.feed(chunk)
                    continue
                ack: Ack | None = None
                for frame in ready:
                    if not isinstance(frame, Data):
                        raise WireError(f"a leader sends DATA frames, not {type(frame).__name__}")
                    ack = self.follower.apply(frame)
                if ack is None:
                    continue
                if self._flush and ack.written > self._log.flushed_position:
                    await loop.run_in_executor(None, self._log.flush)
                writer.write(encode(Ack(ack.written, self._log.flushed_position)))
                # indexed after the answer (the leader's confirmation waits for the bytes, not the
                # index) and at most every INDEX_EVERY_S, so that one index write takes many
                # commits; a heartbeat brings an idle link's last confirmation within HEARTBEAT_S
                if loop.time() - indexed_at >= INDEX_EVERY_S:
                    self.follower.index_confirmed()
                    indexed_at = loop.time()
        finally:
            writer.close()
            if self.connected.is_set():  # (a link that ends: what was confirmed, indexed now)
                try:
                    self.follower.index_confirmed()
                except StoreError as exc:  # (the next link's indexing meets it again, and reports it)
                    log.error("indexing the confirmed records failed error=%s", exc)


    async def _take_seed(self, first: SeedFile, reader: asyncio.StreamReader, frames: FrameReader) -> bool:
        if self._data_dir is None or self._on_seeded is None:
            raise StoreError("the leader sent a seed and this follower cannot take one")
        seed = SeedWriter(self._data_dir)
        log.warning("this replica is seeded by the leader (its log cannot be streamed to) node=%s", self.node)
        frame: object = first
        while not isinstance(frame, SeedDone):
            if not isinstance(frame, SeedFile):
                raise WireError(f"a seed is SEED_FILE frames, not {type(frame).__name__}")
            seed.write(frame.name, frame.offset, frame.payload)
            frame = await _read_within(reader, frames)
        seed.complete(frame.end)
        log.info("seed received node=%s bytes=%d end=%d", self.node, seed.bytes, frame.end)
        self._on_seeded()
        return True


async def _read_within(reader: asyncio.StreamReader, frames: FrameReader) -> object:
    """A follower's next frame from its leader, which never stays silent for SILENCE_S."""
    try:
        async with asyncio.timeout(SILENCE_S):
            return await _read_one(reader, frames)
    except TimeoutError:
        raise ConnectionError(f"the leader sent nothing for {SILENCE_S} s") from None


async def _read_one(reader: asyncio.StreamReader, frames: FrameReader) -> object:
    while True:
        ready = frames.frames(limit=1)
        if ready:
            return ready[0]
        chunk = await reader.read(65536)
        if not chunk:
            raise ConnectionError("the link closed during the handshake")
        frames.feed(chunk)
