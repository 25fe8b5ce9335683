"""RocketMQ remoting on a gateway node: each client connection relayed, frame by frame, to a
connection of its own on the store node's (a replicated group's leader's) remoting port, and
kept through a store failover.

A consumer group's members, queue locks, pops and transaction check-backs live on the broker
that holds the store, so the gateway node runs no broker of its own. Route answers are
rewritten to name the gateway node (the client never learns a store node's address). When the
leader is lost the client's connection stays: requests in flight are sent again to the new
leader or answered SERVICE_NOT_AVAILABLE (protocols/remoting/relay_memory.py), each request that
comes meanwhile waits for it up to HOLD_S, and the client's heartbeat is said again there first.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

from protocols.remoting.errors import RemotingProtocolError
from protocols.remoting.frames import FrameReader, RemotingCommand, encode
from protocols.remoting.relay_memory import RelayMemory

from ..listen import ListeningServer, Servers, listening_sockets
from ..remoting.connection import HTTP2_START, TLS_START
from ..remoting.messages import Origin
from .failover_counts import FailoverCounts
from .leader_lookup import LeaderLookup

log = logging.getLogger("tidemq.cluster")

CHUNK = 1 << 16
HOLD_S = 2.0  # how long a request that comes while there is no leader waits for one before it is refused
MAX_HELD = 1000  # requests of one connection waiting for a leader; more are refused at once
CONNECT_S = 3.0  # one attempt to open a connection on the leader

Target = Callable[[], Awaitable[tuple[str, int]]]


class RemotingRelay:
    """The gateway node's remoting listener's connections; ``leader_moved`` makes each one whose
    server is no longer the leader go to the new one."""

    def __init__(self, target: Target, *, advertised: str, refused_codes: Iterable[int], failover_s: float,
                 max_frame_size: int, connect_timeout_s: float = 10.0, idle_timeout_s: float = 120.0,
                 hello: RemotingCommand | None = None) -> None:
        self.hello = hello  # the store link's HELLO (with the cluster token): its sends are numbered then
        self.target = LeaderLookup(target)  # (shared by the connections: one etcd lookup at a time)
        host, _, port = advertised.rpartition(":")
        origin = Origin.of(host.strip("[]"), int(port))  # (as a broker at this address names itself)
        self.store_host = (origin.host, origin.port)
        self.connect_timeout_s = connect_timeout_s  # a client's first frame comes within this
        self.idle_timeout_s = idle_timeout_s  # a client silent this long is closed (0: never)
        self.advertised = advertised
        self.refused_codes = frozenset(refused_codes)
        self.failover_s = failover_s
        self.max_frame_size = max_frame_size
        self.connections: set[RelayedRemoting] = set()
        self.counts = FailoverCounts()
        self.tasks: set[asyncio.Task[None]] = set()
        # (transport, bytes read, peer, its stream writer): takes a connection that opens with HTTP/2's
        # preface or a TLS handshake instead of a remoting frame (gRPC on this port: rocketmq_grpc/shared_port.py)
        self.http2_handoff: Callable[[asyncio.Transport, bytes, str, object], None] | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = RelayedRemoting(self, reader, writer)
        self.connections.add(connection)
        task = asyncio.current_task()
        if task is not None:
            self.tasks.add(task)  # (awaited by ``close``)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
            if task is not None:
                self.tasks.discard(task)

    def leader_moved(self) -> None:
        for connection in list(self.connections):
            self.spawn(connection.leave_old_server())

    def spawn(self, coroutine: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def close(self) -> None:
        """Every client connection closed, and its tasks ended."""
        for connection in list(self.connections):
            connection.close()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=1.0)
        for task in list(self.tasks):
            task.cancel()


class RelayedRemoting:
    def __init__(self, relay: RemotingRelay, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.relay = relay
        self.client_reader, self.client_writer = reader, writer
        self.memory = RelayMemory(relay.advertised, relay.store_host, relay.refused_codes, hello=relay.hello,
                                  producer=f"relay-{secrets.token_hex(8)}" if relay.hello is not None else "")
        self.server_writer: asyncio.StreamWriter | None = None
        self.server_address: tuple[str, int] | None = None
        self.linked = asyncio.Event()
        self.lost_at = 0.0  # when the server was lost (or first asked for)
        self.linking: asyncio.Task[None] | None = None
        self.held: deque[tuple[float, RemotingCommand]] = deque()  # (due, request) while there is no server
        self.expiring: asyncio.Task[None] | None = None
        self.closed = False
        self.handed_off = False  # the connection is gRPC's (the relay's ``http2_handoff`` took it)

    async def run(self) -> None:
        frames = FrameReader(self.relay.max_frame_size)
        timeout: float | None = self.relay.connect_timeout_s
        first = True
        try:
            while data := await asyncio.wait_for(self.client_reader.read(CHUNK), timeout):
                if first and self._hand_off(data):
                    return
                first = False
                for command in frames.feed(data):
                    await self._from_client(command)
                timeout = self.relay.idle_timeout_s or None
        except asyncio.TimeoutError:
            log.info("remoting relay: client silent for %s s: closed peer=%s", timeout,
                     self.client_writer.get_extra_info("peername"))
        except (RemotingProtocolError, ValueError) as exc:  # (ValueError: a frame the wire cannot carry on)
            log.info("remoting relay: bad frame from the client peer=%s error=%s",
                     self.client_writer.get_extra_info("peername"), exc)
        except (ConnectionError, OSError):
            pass
        finally:
            self.close()

    def _hand_off(self, first: bytes) -> bool:
        """Whether the connection's ``first`` bytes open gRPC (no remoting frame is that long),
        its transport then handed to the relay's ``http2_handoff``."""
        handoff = self.relay.http2_handoff
        if handoff is None or not (first[:4] == HTTP2_START or first[:2] == TLS_START) or len(first) >= CHUNK:
            return False  # (a first read of CHUNK bytes may have left some in the reader: not handed)
        self.handed_off = True
        transport = self.client_writer.transport
        assert isinstance(transport, asyncio.Transport)
        peer = self.client_writer.get_extra_info("peername")
        handoff(transport, first, f"{peer[0]}:{peer[1]}" if peer else "", self.client_writer)
        return True

    def close(self) -> None:
        self.closed = True
        self.held.clear()
        for task in (self.linking, self.expiring):
            if task is not None:
                task.cancel()
        for writer in (self.client_writer, self.server_writer):
            if writer is not None and not (writer is self.client_writer and self.handed_off):
                writer.transport.abort()

    # -- client -> server ----------------------------------------------------------------------
    async def _from_client(self, command: RemotingCommand) -> None:
        if command.is_response:  # (to the server's own request: a check-back, a running-info query)
            if self.linked.is_set():
                self._to_server(command)
            return
        refusal = self.memory.refusal(command)
        if refusal is not None:
            self._to_client([refusal])
            return
        if not self.linked.is_set() or self.held:
            self._hold(command)
            return
        # remembered and written with no wait between: a request in flight is either on this
        # server's connection or in ``memory`` when its loss is handled, never lost between
        self.memory.sent(command)
        self._to_server(command)
        await self.client_writer.drain()  # (the server's answers wait for a slow client)

    def _hold(self, command: RemotingCommand) -> None:
        """No server now: ``command`` waits for one up to HOLD_S (sent in order when linked),
        then is refused; the client goes on sending meanwhile."""
        self._link()
        if len(self.held) >= MAX_HELD:
            self._refuse(command)
            return
        self.held.append((time.monotonic() + HOLD_S, command))
        if self.expiring is None or self.expiring.done():
            self.expiring = self.relay.spawn(self._expire_held())

    async def _expire_held(self) -> None:
        while self.held:
            wait = self.held[0][0] - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self._refuse(self.held.popleft()[1])

    def _refuse(self, command: RemotingCommand) -> None:
        self.relay.counts.no_leader += 1
        answer = self.memory.not_linked(command)
        if answer is not None:
            self._to_client([answer])

    def _to_server(self, command: RemotingCommand) -> None:
        writer = self.server_writer
        if writer is not None and not writer.is_closing():
            writer.write(encode(command))

    def _to_client(self, commands: list[RemotingCommand]) -> None:
        if commands and not self.client_writer.is_closing():
            self.client_writer.write(b"".join(encode(command) for command in commands))

    # -- server -> client ----------------------------------------------------------------------
    async def _from_server(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader(self.relay.max_frame_size)
        try:
            while data := await reader.read(CHUNK):
                out = []
                for command in frames.feed(data):
                    answer = self.memory.answer(command) if command.is_response else command
                    if answer is not None:
                        out.append(answer)
                self._to_client(out)
                await self.client_writer.drain()
        except RemotingProtocolError as exc:
            log.error("remoting relay: bad frame from the store node error=%s", exc)
        except (ConnectionError, OSError):
            pass
        if writer is self.server_writer and not self.closed:
            self._lost()

    def _lost(self) -> None:
        """The server connection ended: answer what is not sent again, and link again."""
        self.linked.clear()
        if self.server_writer is not None:
            self.server_writer.transport.abort()
            self.server_writer = None
        answers = self.memory.lost()
        self.relay.counts.lost += len(answers)
        self._to_client(answers)
        self.lost_at = 0.0
        if self.memory.in_flight or self.memory.heartbeat is not None:  # (else: on the next request)
            log.info("remoting relay: store node connection lost, linking again peer=%s old=%s",
                     self.client_writer.get_extra_info("peername"), self.server_address)
            self._link()

    async def leave_old_server(self) -> None:
        """The store group's leader changed: leave a server that is not it (a stopped old leader
        never closes its connections)."""
        try:
            leader = await self.relay.target()
        except OSError:
            return
        if self.linked.is_set() and leader != self.server_address and self.server_writer is not None:
            log.warning("remoting relay: leaving the old store leader old=%s new=%s", self.server_address, leader)
            self.server_writer.transport.abort()

    # -- linking -------------------------------------------------------------------------------
    def _link(self) -> None:
        if self.linking is None or self.linking.done():
            if not self.lost_at:
                self.lost_at = time.monotonic()
            self.linking = asyncio.get_running_loop().create_task(self._open(), name="remoting-relay-link")

    async def _open(self) -> None:
        """A connection on the leader within ``failover_s``, or the client's connection closed."""
        deadline = self.lost_at + self.relay.failover_s
        while not self.closed and (now := time.monotonic()) < deadline:
            try:
                address = await asyncio.wait_for(self.relay.target(), deadline - now)
                reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), CONNECT_S)
            except (OSError, asyncio.TimeoutError) as exc:
                log.debug("remoting relay: no store leader yet error=%s", exc)
                await asyncio.sleep(0.1)
                continue
            self.server_writer, self.server_address = writer, address
            for command in self.memory.resend():
                writer.write(encode(command))
                self.relay.counts.resent += 1
            while self.held:  # (what came meanwhile, after what was in flight: the client's order)
                command = self.held.popleft()[1]
                self.memory.sent(command)
                writer.write(encode(command))
            self.linked.set()
            self.relay.spawn(self._from_server(reader, writer))
            if self.lost_at and time.monotonic() - self.lost_at > 0.5:
                log.info("remoting relay: linked again in %.2f s leader=%s", time.monotonic() - self.lost_at, address)
            self.lost_at = 0.0
            return
        if not self.closed:
            log.warning("remoting relay: no store leader within %.0f s: client connection closed peer=%s",
                        self.relay.failover_s, self.client_writer.get_extra_info("peername"))
            self.close()


async def start_remoting_relay(host: str, port: int, target: Target, *, advertise: Callable[[str, int], str],
                               refused_codes: Iterable[int], failover_s: float, max_frame_size: int,
                               connect_timeout_s: float, idle_timeout_s: float, hello: RemotingCommand | None
                               ) -> tuple[ListeningServer, RemotingRelay]:
    """``target()``: the store node's remoting address now; ``advertise(host, port)``: the
    address route answers name, from the listener's own; ``hello``: the store link's HELLO,
    said first on each connection so that the store node takes the relay's numbered sends."""
    sockets = await listening_sockets(host, port)
    bound = sockets[0].getsockname()
    relay = RemotingRelay(target, advertised=advertise(bound[0], bound[1]), refused_codes=refused_codes,
                          failover_s=failover_s, max_frame_size=max_frame_size,
                          connect_timeout_s=connect_timeout_s, idle_timeout_s=idle_timeout_s, hello=hello)
    server = await Servers.serving(sockets, lambda sock: asyncio.start_server(relay.serve, sock=sock))
    return server, relay
