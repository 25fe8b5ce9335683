"""AMQP on a gateway node: each client connection relayed, command by command, to the store
node's AMQP listener, and kept through a store failover.

An AMQP queue's consumers compete for its messages, with acknowledgements, requeues, prefetch
and exclusive consumers kept per queue: that state must live in one place, or two nodes would
hand the same message to two consumers. So a gateway node does not run an AMQP broker of its
own; it accepts AMQP clients where devices and apps expect them and relays each connection to
the store node, whose broker serves them as its own.

When a replicated store's leader changes, the relay opens the connection again on the new
leader (protocols/amqp/relay_memory.py: the handshake, channels, prefetch, confirm mode and
consumers; unconfirmed publishes sent again; tags renumbered) and the client sees a pause, not
a disconnect. A connection holding what a failover loses (a transient queue, a transaction) is
closed instead, as a server shutting down closes it (320 CONNECTION_FORCED).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable

from pamqp import commands
from pamqp import frame as pframe

from protocols.amqp.frames import CONNECTION_FORCED, PROTOCOL_HEADER
from protocols.amqp.relay_memory import (CHANNEL_CLOSE, CLOSE, Command, CommandAssembler,
                                         ConnectionMemory, FrameSplitter, NotAMQP, decode)

from ..listen import ListeningServer, Servers, listening_sockets

log = logging.getLogger("tidemq.cluster")

CHUNK = 1 << 16
REPLY_WAIT_S = 3.0  # a new leader's answer to each replayed command (a stopped old leader: none)
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

Target = Callable[[], Awaitable[tuple[str, int]]]


class ReplayRefused(Exception):
    """The new leader refused a replayed command (its text says what and why)."""


class AmqpRelay:
    """The gateway node's AMQP listener's connections; ``leader_moved`` makes each one whose
    server is no longer the leader open itself again there."""

    def __init__(self, target: Target, *, failover_s: float) -> None:
        self.target = target
        self.failover_s = failover_s
        self.connections: set[RelayedConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = RelayedConnection(self, reader, writer)
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)

    def leader_moved(self) -> None:
        for connection in list(self.connections):
            connection.check_server()


class RelayedConnection:
    def __init__(self, relay: AmqpRelay, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.relay = relay
        self.client_reader, self.client_writer = reader, writer
        self.memory = ConnectionMemory(secrets.token_hex(8))  # (its publishes' name: relay_identity.py)
        self.server_reader: asyncio.StreamReader | None = None
        self.server_writer: asyncio.StreamWriter | None = None
        self.server_address: tuple[str, int] | None = None
        self.server_frames = FrameSplitter(header=False)
        self.server_commands = CommandAssembler()
        self.linked = asyncio.Event()
        self.raw = False  # the client's bytes are not AMQP: copied as they come (the server answers)

    async def run(self) -> None:
        peer = self.client_writer.get_extra_info("peername")
        try:
            address = await self.relay.target()
            self.server_reader, self.server_writer = await asyncio.open_connection(*address)
            self.server_address = address
        except OSError as exc:
            log.warning("relay: store node unreachable peer=%s error=%s", peer, exc)
            self.client_writer.close()
            return
        self.linked.set()
        from_client = asyncio.get_running_loop().create_task(self._from_client(), name="amqp-relay-client")
        try:
            while await self._from_server() and not from_client.done() and await self._open_again():
                pass
        finally:
            from_client.cancel()
            for writer in (self.client_writer, self.server_writer):
                if writer is not None:
                    writer.close()

    def check_server(self) -> None:
        """The store group's leader changed: leave a server that is not it (a stopped old leader
        never closes its connections)."""
        task = asyncio.get_running_loop().create_task(self._leave_old_server())
        self.relay.tasks.add(task)
        task.add_done_callback(self.relay.tasks.discard)

    async def _leave_old_server(self) -> None:
        try:
            leader = await self.relay.target()
        except OSError:
            return
        if self.linked.is_set() and leader != self.server_address and self.server_writer is not None:
            log.warning("relay: leaving the old store leader old=%s new=%s", self.server_address, leader)
            self.server_writer.transport.abort()

    # -- client -> server ----------------------------------------------------------------------
    async def _from_client(self) -> None:
        frames = FrameSplitter(header=True)
        assembler = CommandAssembler()
        reader = self.client_reader
        checked = False
        try:
            while data := await reader.read(CHUNK):
                # linked first, then remembered and written with no wait between: a publish
                # remembered is either on this server's connection or published again by the
                # replay on the next one, never both
                await self.linked.wait()
                if self.raw:
                    await self._to_server(data)
                    continue
                found = []
                try:
                    found = frames.feed(data)
                    if found and not checked:
                        checked = True
                        if found[0] != PROTOCOL_HEADER:
                            raise NotAMQP("another protocol's header")
                except NotAMQP:
                    self.raw = True  # (the server answers with its protocol header, or closes)
                    self.memory.unreplayable = "its bytes are not AMQP 0-9-1"
                    await self._to_server(b"".join(found) + frames.rest() if found else frames.rest())
                    continue
                out = []
                for command in assembler.commands(found):
                    passed = self.memory.from_client(command)
                    if passed is not None:
                        out += passed
                if out:
                    await self._to_server(b"".join(out))
        except (ConnectionError, OSError):
            pass
        # the client left: so does the server connection (its reader then ends the relay)
        self.memory.closing = True
        if self.server_writer is not None:
            self.server_writer.transport.abort()

    async def _to_server(self, data: bytes) -> None:
        """Written to the server connection of now (the caller awaited ``linked``); lost with
        it, what must be sent again is remembered (relay_memory) and sent by the replay."""
        writer = self.server_writer
        assert writer is not None and self.linked.is_set()
        try:
            writer.write(data)
            await writer.drain()
        except (ConnectionError, OSError):
            if self.memory.closing:
                raise
            if writer is self.server_writer:  # (not linked again meanwhile)
                self.linked.clear()
                writer.transport.abort()

    # -- server -> client ----------------------------------------------------------------------
    async def _from_server(self) -> bool:
        """Relay until the server connection ends; True: it was lost (not closed by either side)."""
        reader = self.server_reader
        assert reader is not None
        try:
            while data := await reader.read(CHUNK):
                if self.raw:
                    await self._to_client(data)
                    continue
                out = []
                for command in self.server_commands.commands(self.server_frames.feed(data)):
                    if self._forced_close(command):
                        return True
                    passed = self.memory.from_server(command)
                    if passed is not None:
                        out += passed
                if out:
                    await self._to_client(b"".join(out))
        except NotAMQP:
            return False
        except (ConnectionError, OSError):
            if self.client_writer.is_closing():
                return False
        return not self.memory.closing and not self.client_writer.is_closing()

    def _forced_close(self, command: Command) -> bool:
        """connection.close 320 from the server: it is shutting down (a leader stepping down),
        which is a failover for this connection, not the end of it."""
        if command[1] != CLOSE or self.memory.closing:
            return False
        close = decode(command[2][0])
        if close.reply_code != CONNECTION_FORCED or not self.memory.replayable():
            return False
        assert self.server_writer is not None
        self.server_writer.write(pframe.marshal(commands.Connection.CloseOk(), 0))
        return True

    async def _to_client(self, data: bytes) -> None:
        self.client_writer.write(data)
        await self.client_writer.drain()

    # -- a failover ------------------------------------------------------------------------------
    async def _open_again(self) -> bool:
        """The server connection was lost: open this connection again on the store group's
        leader, within ``failover_s``, or close it as a server shutting down would."""
        self.linked.clear()
        if self.server_writer is not None:
            self.server_writer.transport.abort()
        memory = self.memory
        if not memory.replayable():
            await self._close_client(memory.unreplayable or "its handshake was not finished")
            return False
        memory.begin_replay()
        lost_at = time.monotonic()
        deadline = lost_at + self.relay.failover_s
        beat_s = max(memory.heartbeat_s / 2, 1.0) if memory.heartbeat_s else 0.0
        last_beat = lost_at
        while (now := time.monotonic()) < deadline:
            if memory.closing or self.client_writer.is_closing():
                return False  # (the client left meanwhile)
            if beat_s and now - last_beat >= beat_s:  # the client must not give up on us meanwhile
                last_beat = now
                self.client_writer.write(HEARTBEAT_FRAME)
            try:
                address = await asyncio.wait_for(self.relay.target(), deadline - now)
                reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), REPLY_WAIT_S)
            except (OSError, asyncio.TimeoutError) as exc:
                log.debug("relay: no store leader yet error=%s", exc)
                await asyncio.sleep(0.2)
                continue
            try:
                await self._replay(reader, writer)
            except ReplayRefused as exc:
                writer.close()
                await self._close_client(f"the new store leader refused {exc}")
                return False
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
                writer.close()
                log.debug("relay: replay failed, trying again error=%s", exc)
                await asyncio.sleep(0.2)
                continue
            self.server_reader, self.server_writer, self.server_address = reader, writer, address
            writer.write(memory.after_replay())
            self.linked.set()
            log.info("relay: connection opened again on the new store leader in %.2f s leader=%s",
                     time.monotonic() - lost_at, address)
            return True
        await self._close_client(f"no store leader within {self.relay.failover_s:.0f} s")
        return False

    async def _replay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Each step sent and its reply awaited; what else the server sends meanwhile (deliveries
        to consumers already replayed) goes to the client."""
        self.server_frames = FrameSplitter(header=False)
        self.server_commands = CommandAssembler()
        waiting: list[Command] = []
        for data, channel, reply in self.memory.replay_steps():
            writer.write(data)
            while True:
                while not waiting:
                    chunk = await asyncio.wait_for(reader.read(CHUNK), REPLY_WAIT_S)
                    if not chunk:
                        raise ConnectionError("the new leader closed the connection")
                    waiting = self.server_commands.commands(self.server_frames.feed(chunk))
                command = waiting.pop(0)
                if command[0] == channel and command[1] == reply:
                    break
                if command[1] == CLOSE or command[1] == CHANNEL_CLOSE:
                    close = decode(command[2][0])
                    raise ReplayRefused(f"{getattr(close, 'reply_code', '')} {getattr(close, 'reply_text', '')}")
                passed = self.memory.from_server(command)
                if passed is not None:
                    await self._to_client(b"".join(passed))
        for command in waiting:  # (arrived with the last reply)
            passed = self.memory.from_server(command)
            if passed is not None:
                await self._to_client(b"".join(passed))

    async def _close_client(self, reason: str) -> None:
        log.warning("relay: client connection closed at a store failover: %s", reason)
        close = commands.Connection.Close(reply_code=CONNECTION_FORCED,
                                          reply_text=f"CONNECTION_FORCED - store failover: {reason}"[:255],
                                          class_id=0, method_id=0)
        try:
            await self._to_client(pframe.marshal(close, 0))
        except (ConnectionError, OSError):
            pass


async def start_relay(host: str, port: int, target: Target, *, failover_s: float) -> tuple[ListeningServer, AmqpRelay]:
    """``target()``: the store node's AMQP address now (a replicated store's leader changes)."""
    relay = AmqpRelay(target, failover_s=failover_s)
    server = await Servers.serving(await listening_sockets(host, port),
                                   lambda sock: asyncio.start_server(relay.serve, sock=sock))
    return server, relay
