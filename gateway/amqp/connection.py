"""One AMQP 0-9-1 connection: an asyncio Protocol that feeds the sans-IO frame reader,
negotiates (start/start-ok with PLAIN or AMQPLAIN, tune, open; update-secret), keeps heartbeats
both ways, opens and closes channels, turns AMQPError into channel.close / connection.close with
its reply code, and hands the publishes it reads to its inbound side (inbound.py: one group
commit per read, confirms once stored).

After a connection.close (either side's) the connection is not read into memory any more: as
RabbitMQ, what the client still sends is dropped until close-ok (ours to wait for) or its own
close of the socket, for at most ``CLOSE_TIMEOUT_S``."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import platform
import time
from typing import TYPE_CHECKING

from pamqp import commands
from pamqp.base import Frame
from pamqp.common import FieldTable

from protocols.amqp.frames import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    HEARTBEAT_FRAME,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    SYNTAX_ERROR,
    AMQPError,
    ContentReceived,
    Event,
    HeartbeatReceived,
    MethodReceived,
    ProtocolHeaderReceived,
    channel_error,
    connection_error,
    method_frame,
)
from protocols.amqp.login import mechanisms
from protocols.amqp.reader import FrameReader
from protocols.amqp.relay_identity import relay_identity
from store import StoreError

from .. import __version__
from ..deadlines import Deadlines, Slot
from ..read_pauses import ReadPauses
from .broker import AMQPBroker
from .channel import NOTHING, Channel
from .inbound import Inbound
from .login import authenticate, update_secret
from .permissions import vhost_refusal

if TYPE_CHECKING:
    from ..trace import Tracer

log = logging.getLogger("tidemq.amqp")

# Publishes of one connection on their way to the store before it is not read from any more:
# the store's group commit takes them all at once, so this only bounds memory per publisher.
# how long a closed connection waits for the client's close-ok or end of stream
CLOSE_TIMEOUT_S = 2.0


@functools.cache
def server_properties(cluster_name: str) -> FieldTable:
    """connection.start's server properties, with the keys RabbitMQ clients read. A capability
    is true only for what is built."""
    return {
        "product": "TideMQ",
        "version": __version__,
        "platform": f"Python {platform.python_version()}",
        "cluster_name": cluster_name,
        "copyright": "Copyright (c) the TideMQ authors",
        "information": "Licensed under the Apache License 2.0",
        "capabilities": {
            "publisher_confirms": True, "exchange_exchange_bindings": True, "basic.nack": True,
            "consumer_cancel_notify": True, "connection.blocked": True, "authentication_failure_close": True,
            "per_consumer_qos": True, "consumer_priorities": True, "direct_reply_to": True,
        },
    }


class AMQPConnection(asyncio.Protocol):
    def __init__(self, broker: AMQPBroker, tracer: Tracer | None = None) -> None:
        self.broker = broker
        self.tracer = tracer  # this listener's message trace, when it is on
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.reader = FrameReader(frame_max=broker.frame_max, max_body=broker.max_message_size)
        self.frame_max = broker.frame_max
        self.channel_max = broker.channel_max
        self.heartbeat = 0
        self.channels: dict[int, Channel] = {}
        self.closing_channels: set[int] | frozenset[int] = NOTHING  # (shared until its first entry)
        # header -> start-ok -> tune-ok -> open -> open-done; then closing (we sent
        # connection.close, close-ok awaited) or closed (we sent close-ok, end of stream awaited)
        self.stage = "header"
        self.username: str | None = None
        self.last_queue = ""  # queue.declare's name, for methods that leave the queue empty
        self.exclusive_queues: set[str] | frozenset[str] = NOTHING
        self.closed = False
        self.writing_paused = False
        self.wants_blocked_notice = False  # the client announced the connection.blocked capability
        # a gateway node's relay of a client (protocols/amqp/relay_identity.py): (token, generation)
        self.relay: tuple[str, int] | None = None
        # a publish read while the resource alarm is raised, or a method that waits for this
        # connection's publishes to be stored ("ordering")
        self._held: ContentReceived | MethodReceived | None = None
        self.told_blocked = False
        self.read_pauses = ReadPauses()  # "auth", "puts" (too many on their way), "alarm"
        self.inbound = Inbound(self)  # its publishes: routed, stored, confirmed
        self._out: list[bytes] = []
        self._output_held: asyncio.Future[None] | None = None  # frames wait for it (hold_output)
        self._last_received = time.monotonic()
        self._last_sent = time.monotonic()
        self._timer: Slot | None = None  # the handshake timeout's, then the heartbeat's (broker.deadlines)
        self._beating = False  # the handshake is over: the deadline is the heartbeat's

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (a Transport: every listener gives one)
        self.read_pauses.transport = self.transport
        peer = transport.get_extra_info("peername")
        self.peer = self.inbound.puts.who = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.broker.connections.add(self)
        self.broker.stats.connections_total += 1
        self._timer = self.broker.deadlines.later(self.broker.connect_timeout_s, self)

    def data_received(self, data: bytes) -> None:
        self._last_received = time.monotonic()
        self.broker.stats.bytes_received += len(data)
        if self.stage == "closed":
            return  # we sent close-ok: dropped until the client closes the socket
        self.reader.feed(data)  # (dropped by a reader whose framing broke)
        self._process()
        if self.reader.buffered:
            self.broker.stalled.watch(self)

    def _process(self, held: ContentReceived | MethodReceived | None = None) -> None:
        # a channel error closes that channel only: the frames read after it are still handled
        # (and after a connection error, a close-ok among them)
        while not self.closed and not self._process_until_error(held):
            held = None
        self.flush()

    def _process_until_error(self, held: ContentReceived | MethodReceived | None) -> bool:
        """Handle the buffered frames; False if an error stopped it before the end of a
        stream that can still be read."""
        publishes: list[ContentReceived] = []
        broker = self.broker
        events = self.reader.events()
        try:
            for event in itertools.chain((held,), events) if held is not None else events:
                if isinstance(event, ContentReceived):
                    if self.stage == "open-done":
                        if broker.blocked:
                            # the store's resource alarm: this publish and what follows it wait
                            # (unread, in order) until it clears
                            self._held = event
                            self.read_pauses.pause("alarm")
                            break
                        publishes.append(event)
                    continue
                if publishes:
                    self.inbound.receive(publishes)
                    publishes = []
                if self.inbound.pending and _reads_stored_state(event):
                    # answered from the store: this connection's publishes before it must be
                    # stored first (a channel reads its own writes, as on RabbitMQ)
                    self._held = event
                    self.read_pauses.pause("ordering")
                    break
                self._event(event)
                if self.closed:
                    return True
        except AMQPError as exc:
            events.close()  # the reader keeps what follows the failed frame
            if publishes:
                self.inbound.receive(publishes)
            self.fail(exc)
            return self.reader.failed
        if publishes:
            self.inbound.receive(publishes)
        return True

    # -- flow control --------------------------------------------------------------------------
    def resource_alarm(self, reason: str | None) -> None:
        """The store's alarm was raised (a reason) or cleared (None). As RabbitMQ: clients that
        asked are told (connection.blocked / unblocked); a connection that publishes while it
        is raised is not read from until it clears; consumers go on."""
        if self.stage != "open-done" or self.closed:
            return
        if self.wants_blocked_notice and self.told_blocked != (reason is not None):
            self.told_blocked = reason is not None
            self.send(method_frame(0, commands.Connection.Blocked(reason[:255]) if reason
                                   else commands.Connection.Unblocked()))
            self.flush()
        if reason is None and "alarm" in self.read_pauses:
            held, self._held = self._held, None
            self.read_pauses.resume("alarm")
            self._process(held)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        Deadlines.cancel(self._timer, self)
        self._timer = None
        self.broker.stalled.forget(self)
        self._end_channels()
        self.broker.connections.discard(self)

    def _end_channels(self) -> None:
        """The connection is closing: its channels give back what they did not ack, its
        exclusive queues go."""
        for channel in list(self.channels.values()):
            channel.release()
        self.channels.clear()
        for name in list(self.exclusive_queues):
            queue = self.broker.queues.get(name)
            if queue is not None:
                self.broker.declarations.remove_queue(queue)
        self.exclusive_queues = NOTHING

    def _closing(self, stage: str, method: Frame) -> None:
        """Send connection.close (stage closing: only close-ok is looked for in what comes) or
        close-ok (stage closed: what comes is dropped unread) and end the session; the socket is
        closed by close-ok, the client, or ``CLOSE_TIMEOUT_S``."""
        self.send(method_frame(0, method))
        self.stage = stage
        self.reader.methods_only()
        self._end_channels()
        self._held = None  # a publish held by the resource alarm is dropped with the rest
        for why in ("alarm", "puts"):  # read on, to find close-ok or the end of the stream
            self.read_pauses.resume(why)
        self.flush()
        asyncio.get_running_loop().call_later(CLOSE_TIMEOUT_S, self.close_transport)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        for channel in self.channels.values():
            for consumer in channel.consumers.values():
                queue = self.broker.queues.get(channel.broker_queue_name(consumer))
                if queue is not None:
                    queue.schedule_pump()

    # -- output --------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self._out.append(data)

    def hold_output(self, settling: asyncio.Future[None]) -> None:
        """Frames sent from now on wait until ``settling`` is done: a reply that says a declaration
        is kept, until the in-sync replicas hold it (a replicated store). If they do not, the
        connection closes: its client cannot be told the declaration is kept."""
        self._output_held = settling
        settling.add_done_callback(self._output_settled)

    def _output_settled(self, settling: asyncio.Future[None]) -> None:
        if self._output_held is settling:
            self._output_held = None
        error = settling.exception()
        if error is not None:
            self._out.clear()
            self.send(method_frame(0, commands.Connection.Close(
                INTERNAL_ERROR, f"INTERNAL_ERROR - not kept by the store's replicas: {error}"[:255], 0, 0)))
        self.flush()

    def flush(self) -> None:
        if self._output_held is not None:
            return
        if self._out and self.transport is not None and not self.closed:
            data = b"".join(self._out)
            self.broker.stats.bytes_sent += len(data)
            self.transport.write(data)
            self._last_sent = time.monotonic()
        self._out.clear()

    def close_transport(self) -> None:
        self.flush()
        if self.transport is not None and not self.closed:
            self.transport.close()

    def shutdown(self) -> None:
        if self.stage == "open-done":
            self.send(method_frame(0, commands.Connection.Close(CONNECTION_FORCED, "CONNECTION_FORCED - server shutdown", 0, 0)))
        self.close_transport()

    # -- errors --------------------------------------------------------------------------------
    def fail_channel(self, exc: AMQPError) -> None:
        """An error found outside the frame loop (a refused new secret)."""
        self.fail(exc)
        self.flush()

    def fail(self, exc: AMQPError) -> None:
        """Close the channel (channel.close) or the connection (connection.close) ``exc`` names."""
        if self.stage in ("closing", "closed"):
            return  # one close per connection, logged once; the rest is dropped until it ends
        open_or_closing = exc.channel in self.channels or exc.channel in self.closing_channels
        if not exc.connection and exc.channel and not open_or_closing:  # (a publish on no open channel)
            exc = connection_error(CHANNEL_ERROR, f"channel {exc.channel} is not open", exc.channel, exc.method)
        log.info("amqp %s error peer=%s code=%d text=%r", "connection" if exc.connection else "channel",
                 self.peer, exc.reply_code, exc.text)
        if exc.connection or exc.channel == 0:
            if self.stage in ("header", "start-ok", "tune-ok"):
                self.close_transport()  # before open, a failed handshake just closes
                return
            self._closing("closing", commands.Connection.Close(*exc.close_arguments()))
            return
        if exc.channel in self.closing_channels:
            return  # its channel.close is sent already
        channel = self.channels.pop(exc.channel, None)
        if channel is not None:
            channel.release()
        self.reader.forget_channel(exc.channel)
        if isinstance(self.closing_channels, frozenset):  # (NOTHING, until the first)
            self.closing_channels = set()
        self.closing_channels.add(exc.channel)
        self.send(method_frame(exc.channel, commands.Channel.Close(*exc.close_arguments())))

    # -- events --------------------------------------------------------------------------------
    def _event(self, event: Event) -> None:
        if isinstance(event, ProtocolHeaderReceived):
            if not event.ok:
                self.send(PROTOCOL_HEADER)  # the version we speak, then close (spec 4.2.2)
                self.close_transport()
                return
            start = commands.Connection.Start(server_properties=server_properties(self.broker.cluster_name),
                                              mechanisms=mechanisms(self.broker.allow_anonymous))
            self.send(method_frame(0, start))
            self.stage = "start-ok"
            return
        if isinstance(event, HeartbeatReceived):
            return
        assert isinstance(event, MethodReceived)
        method, number = event.method, event.channel
        if self.stage in ("closing", "closed"):
            if isinstance(method, commands.Connection.CloseOk):
                self.close_transport()
            elif isinstance(method, commands.Connection.Close) and self.stage == "closing":
                self.send(method_frame(0, commands.Connection.CloseOk()))  # both closed at once
                self.close_transport()
            return  # after connection.close, everything else is discarded
        if number == 0:
            self._connection_method(method)
            return
        if self.stage != "open-done":
            raise connection_error(COMMAND_INVALID, "channel method before connection.open", number, method)
        closing = self.closing_channels
        if number in closing:
            if isinstance(method, commands.Channel.CloseOk):
                assert isinstance(closing, set)  # (NOTHING holds no channel)
                closing.discard(number)
            elif isinstance(method, commands.Channel.Close):
                self.send(method_frame(number, commands.Channel.CloseOk()))
            return  # discarded until close-ok (spec 2.2.5)
        if isinstance(method, commands.Channel.Open):
            if number in self.channels:
                raise connection_error(CHANNEL_ERROR, f"channel {number} is already open", number, method)
            if number > self.channel_max:
                raise connection_error(CHANNEL_ERROR, f"channel {number} above channel_max", number, method)
            self.channels[number] = Channel(self, number, self.inbound)
            self.send(method_frame(number, commands.Channel.OpenOk()))
            return
        channel = self.channels.get(number)
        if channel is None:
            raise connection_error(CHANNEL_ERROR, f"channel {number} is not open", number, method)
        if isinstance(method, commands.Channel.Close):
            channel.release()
            del self.channels[number]
            self.reader.client_closed_channel(number)
            self.send(method_frame(number, commands.Channel.CloseOk()))
            return
        if isinstance(method, commands.Channel.CloseOk):
            return
        try:
            channel.handle(method)
        except AMQPError as exc:
            if exc.channel == 0 and not exc.connection:
                exc.channel = number
            raise
        except (ValueError, TypeError, KeyError) as exc:
            raise channel_error(PRECONDITION_FAILED, str(exc), number, method) from None
        except StoreError as exc:  # (a declaration not written: a full disk) the channel closes, as RabbitMQ's
            raise channel_error(INTERNAL_ERROR, f"not stored: {exc}", number, method) from None

    def _connection_method(self, method: Frame) -> None:
        if isinstance(method, commands.Connection.StartOk) and self.stage == "start-ok":
            self.stage = "authenticating"
            capabilities = (method.client_properties or {}).get("capabilities") or {}
            self.wants_blocked_notice = isinstance(capabilities, dict) and bool(capabilities.get("connection.blocked"))
            self.relay = relay_identity(method.client_properties)
            self.read_pauses.pause("auth")
            asyncio.get_running_loop().create_task(authenticate(self, method))
        elif isinstance(method, commands.Connection.TuneOk) and self.stage == "tune-ok":
            if method.frame_max and method.frame_max < 4096:
                raise connection_error(SYNTAX_ERROR, "frame_max below 4096", 0, method)
            if method.frame_max:  # the client may lower it: then its frames are held to it too
                self.frame_max = self.reader.frame_max = min(self.frame_max, method.frame_max)
            if method.channel_max:
                self.channel_max = min(self.channel_max, method.channel_max)
            self.heartbeat = method.heartbeat
            self.stage = "open"
        elif isinstance(method, commands.Connection.Open) and self.stage == "open":
            if method.virtual_host not in ("/", ""):
                raise connection_error(NOT_ALLOWED, f"vhost '{method.virtual_host}' not found", 0, method)
            refusal = vhost_refusal(self)
            if refusal is not None:
                raise connection_error(NOT_ALLOWED, refusal, 0, method)
            self.stage = "open-done"
            self.send(method_frame(0, commands.Connection.OpenOk()))
            Deadlines.cancel(self._timer, self)
            self._timer = None
            self._beating = True
            if self.heartbeat:
                self._timer = self.broker.deadlines.later(self.heartbeat / 2, self)
            if self.broker.blocked and self.broker.pressure is not None:
                self.resource_alarm(self.broker.pressure.reason)
        elif isinstance(method, commands.Connection.Close):
            # as RabbitMQ: close-ok, then the client closes the socket; until it does (or for
            # CLOSE_TIMEOUT_S) what it still sends is read and dropped, so it never meets EPIPE
            self._closing("closed", commands.Connection.CloseOk())
        elif isinstance(method, commands.Connection.CloseOk):
            self.close_transport()
        elif isinstance(method, commands.Connection.UpdateSecret) and self.stage == "open-done":
            self.read_pauses.pause("auth")
            asyncio.get_running_loop().create_task(update_secret(self, method))
        else:
            raise connection_error(COMMAND_INVALID, f"unexpected {method.name} on channel 0", 0, method)

    def deadline_reached(self) -> None:
        self._timer = None
        (self._beat if self._beating else self._handshake_timeout)()

    def stalled_since(self) -> float | None:
        if self.closed or not self.reader.buffered:
            return None
        if self.read_pauses.reasons:  # we are not reading: the rest may wait in the socket
            self._last_received = time.monotonic()
        return self._last_received

    def read_timed_out(self) -> None:
        log.info("amqp frame unfinished, closing peer=%s buffered=%d timeout_s=%s", self.peer, self.reader.buffered,
                 self.broker.stalled.timeout_s)
        self.close_transport()

    def _handshake_timeout(self) -> None:
        if self.stage != "open-done" and not self.closed:
            log.info("amqp handshake timeout peer=%s stage=%s", self.peer, self.stage)
            self.close_transport()

    def _beat(self) -> None:
        if self.closed or not self.heartbeat:
            return
        now = time.monotonic()
        if self.read_pauses.reasons:  # we are not reading: its heartbeats wait in the socket
            self._last_received = now
        if now - self._last_received > 2 * self.heartbeat:
            log.info("amqp heartbeat missed peer=%s heartbeat=%d", self.peer, self.heartbeat)
            self.close_transport()
            return
        if now - self._last_sent >= self.heartbeat / 2:
            self.send(HEARTBEAT_FRAME)
            self.flush()
        self._timer = self.broker.deadlines.later(self.heartbeat / 2, self)

    # -- publishing ----------------------------------------------------------------------------
    def publishes_stored(self) -> None:
        """The inbound side's publishes were stored and confirmed: a method held until they
        were is handled now."""
        if not self.inbound.pending and "ordering" in self.read_pauses and not self.closed:
            held, self._held = self._held, None
            self.read_pauses.resume("ordering")
            self._process(held)
        self.flush()


def _reads_stored_state(event: object) -> bool:
    """A method whose answer depends on what is stored in a queue (its messages or their count)."""
    return isinstance(event, MethodReceived) and isinstance(event.method, _READS_STORED_STATE)


_READS_STORED_STATE = (commands.Basic.Get, commands.Queue.Declare, commands.Queue.Purge, commands.Queue.Delete)
