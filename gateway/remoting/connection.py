"""One remoting connection: an asyncio Protocol that feeds the sans-IO frame reader, hands
each request to the broker and writes the responses -- at once, when the store has made a
send durable (a callback, no task), or from a task for a request that may wait (a held pull
must not stop the sends behind it); responses ready together go out in one write. It also
sends the broker's own requests to the client (one-way NOTIFY_CONSUMER_IDS_CHANGED). A
malformed or oversized frame closes only this connection, and so does a first request that does
not come within ``connect_timeout_s`` (as MQTT's CONNECT and AMQP's handshake), no request for
the broker's ``idle_timeout_s`` after it (clients heartbeat), or a frame left unfinished for
its ``stalled`` reads' timeout."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from typing import TYPE_CHECKING

from protocols.remoting.codes import RequestCode, ResponseCode
from protocols.remoting.errors import RemotingProtocolError
from protocols.remoting.frames import (
    FLAG_ONEWAY,
    FrameReader,
    RemotingCommand,
    encode,
    response_to,
)
from store import Hold, StoredMessage

from ..auth.authorize import Principal
from ..deadlines import Deadlines, Slot
from .access import ANONYMOUS
from .broker import Pending, RemotingBroker

if TYPE_CHECKING:
    from ..trace import Tracer

log = logging.getLogger("tidemq.remoting")

_opaques = itertools.count(1)
HTTP2_START = b"PRI "  # how HTTP/2's connection preface begins
TLS_START = b"\x16\x03"  # ... and a TLS handshake record


class RemotingConnection(asyncio.Protocol):
    def __init__(self, broker: RemotingBroker, *, max_frame_size: int, tracer: Tracer | None = None) -> None:
        self.broker = broker
        self.tracer = tracer  # this listener's message trace, when it is on
        self.reader = FrameReader(max_frame_size=max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.client_id = ""
        self.principal: Principal = ANONYMOUS  # of the request being dispatched (access.py)
        self.put_producer: tuple[bytes, int] | None = None  # ... and its relay's number, if a numbered send
        self.closed = False
        self._timer: Slot | None = None  # the first request's timeout, then the idle one's (broker.deadlines)
        self._spoke = False  # a frame came: the timer is the idle timeout's
        self._idle_timeout_s = broker.idle_timeout_s  # (0: none)
        self.last_received = 0.0  # time.monotonic() of the last bytes read
        self._last_frame = 0.0  # ... and of the last whole frame
        # requests being served by a task of their own (long polling); made with the first: an
        # empty set is 216 bytes, and most connections never have one
        self._tasks: set[asyncio.Task[None]] | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._waiting: dict[int, asyncio.Future[RemotingCommand]] = {}  # our requests, by opaque

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (a Transport: every listener gives one)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else ""
        self.broker.connections.add(self)
        self.broker.stats.connections_total += 1
        self._timer = self.broker.deadlines.later(self.broker.connect_timeout_s, self)

    def deadline_reached(self) -> None:
        """No first request in time, or (then) none for the idle timeout?"""
        self._timer = None
        if self.closed:
            return
        if not self._spoke:
            log.info("remoting no request in time, closing peer=%s timeout_s=%s", self.peer,
                     self.broker.connect_timeout_s)
            self.close()
            return
        if not self._idle_timeout_s:
            return
        idle = time.monotonic() - self._last_frame
        if idle >= self._idle_timeout_s:
            log.info("remoting connection idle, closing peer=%s client_id=%s idle_timeout_s=%s", self.peer,
                     self.client_id or "-", self._idle_timeout_s)
            self.close()
            return
        self._timer = self.broker.deadlines.later(self._idle_timeout_s - idle, self)

    def exempt_from_idle_timeout(self) -> None:
        """A peer node's link (the store link): quiet while its node is; the lookup and the
        link's own requests watch that node, not this timeout."""
        self._idle_timeout_s = 0.0
        Deadlines.cancel(self._timer, self)
        self._timer = None

    def stalled_since(self) -> float | None:
        return self.last_received if self.reader.buffered and not self.closed else None

    def read_timed_out(self) -> None:
        log.info("remoting frame unfinished, closing peer=%s buffered=%d timeout_s=%s", self.peer,
                 self.reader.buffered, self.broker.stalled.timeout_s)
        self.close()

    def data_received(self, data: bytes) -> None:
        if not self._spoke and (data[:4] == HTTP2_START or data[:2] == TLS_START) \
                and self.broker.http2_handoff is not None and not self.reader.buffered:
            # (no remoting frame is that long: gRPC on this port, plain or over TLS)
            self._hand_off(data)
            return
        self.broker.stats.bytes_received += len(data)
        self.last_received = now = time.monotonic()
        try:
            commands = self.reader.feed(data)
        except RemotingProtocolError as exc:
            self.broker.limited_log.log(logging.INFO, "bad_frame", "remoting bad frame, closing peer=%s error=%s",
                                        self.peer, json.dumps(str(exc)))
            self.close()
            return
        if commands:
            self._last_frame = now
            if not self._spoke:
                self._spoke = True
                Deadlines.cancel(self._timer, self)
                self._timer = None
                if self._idle_timeout_s:
                    self._timer = self.broker.deadlines.later(self._idle_timeout_s, self)
        if self.reader.buffered:
            self.broker.stalled.watch(self)
        for command in commands:
            if not command.is_response:
                self._dispatch(command)
            else:  # the answer to a request of ours (a store node asking a gateway node)
                waiter = self._waiting.pop(command.opaque, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(command)
        self.flush()

    def _hand_off(self, data: bytes) -> None:
        """This connection is no remoting one: the broker's ``http2_handoff`` takes its transport."""
        assert self.transport is not None and self.broker.http2_handoff is not None
        self.closed = True
        Deadlines.cancel(self._timer, self)
        self._timer = None
        self.broker.connections.discard(self)
        self.broker.http2_handoff(self.transport, data, self.peer)
        self.transport = None

    def _dispatch(self, request: RemotingCommand) -> None:
        try:
            reply = self.broker.dispatch(self, request)
        except Exception:  # a bug must not take the connection (or the loop's reader) down
            log.exception("remoting request failed code=%d peer=%s", request.code, self.peer)
            reply = response_to(request, ResponseCode.SYSTEM_ERROR, "internal error")
        if isinstance(reply, Pending):  # a store write: answered when it is durable, no task
            reply.future.add_done_callback(lambda f: self._pending_done(request, reply, f))
        elif asyncio.iscoroutine(reply):  # may wait (long polling): its own task
            task = asyncio.get_running_loop().create_task(self._serve(request, reply))
            if self._tasks is None:
                self._tasks = set()
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif reply is not None and not request.is_oneway:
            self.send(reply)

    def _pending_done(self, request: RemotingCommand, reply: Pending, future: asyncio.Future) -> None:
        if future.cancelled():
            return
        error = future.exception()
        response = self.broker.error_response(request, error) if error else reply.respond(future.result())
        if response is not None and not request.is_oneway:
            self.send(response)
            self.flush_soon()

    async def _serve(self, request: RemotingCommand, work) -> None:
        try:
            response = await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            response = self.broker.error_response(request, exc)
        if response is not None and not request.is_oneway:
            self.send(response)
            self.flush()

    async def call(self, code: int, ext_fields: dict[str, str], timeout: float) -> RemotingCommand:
        """Send a request to the peer and wait for its answer (TimeoutError, ConnectionError)."""
        if self.closed:
            raise ConnectionError("the connection is closed")
        opaque = next(_opaques)
        waiter: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._waiting[opaque] = waiter
        self.send(RemotingCommand(code, opaque, ext_fields=ext_fields))
        self.flush()
        try:
            return await asyncio.wait_for(waiter, timeout)
        finally:
            self._waiting.pop(opaque, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        Deadlines.cancel(self._timer, self)
        self._timer = None
        self.broker.stalled.forget(self)
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError("the connection closed"))
        self.broker.connections.discard(self)
        self.broker.groups.connection_closed(self)
        self.broker.producers.connection_closed(self)
        for task in self._tasks or ():
            task.cancel()

    # -- output --------------------------------------------------------------------------------
    def send(self, command: RemotingCommand) -> None:
        self._out.append(encode(command))

    def flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.closed:
            data = b"".join(self._out)
            self.broker.stats.bytes_sent += len(data)
            self.transport.write(data)
        self._out.clear()

    def flush_soon(self) -> None:
        """One write for every response that becomes ready in this turn of the loop."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def notify_consumer_ids_changed(self, group: str) -> None:
        self.send(RemotingCommand(code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, opaque=next(_opaques),
                                  flag=FLAG_ONEWAY, ext_fields={"consumerGroup": group}))
        self.flush_soon()

    def check_transaction(self, message: StoredMessage, hold: Hold) -> None:
        """Ask this producer about a half message (transactions.py)."""
        self.broker.transactions.check_over_remoting(self, message, hold)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
