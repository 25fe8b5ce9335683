"""RocketMQ 5 (gRPC) clients on a gateway node: each ``MessagingService`` call proxied, as its
bytes, to the store node's (a replicated group's leader's) gRPC listener, with the caller's
metadata (its signature included) and deadline.

It listens on a plain port, a TLS one (the server's certificate chain and key), or both, and
takes the gRPC connections of the node's remoting port (gateway/rocketmq_grpc/shared_port.py);
route and assignment answers are rewritten to name the node's endpoint the call came to
(protocols/rocketmq_grpc/proxy_rules.py). Calls go on to the leader over plain gRPC. A call
waits for a leader that accepts connections (within its deadline, or HOLD_S); a call lost with
the leader is made again on the next one when doing it twice changes nothing (a send too: the
store answers it again as the first time, by its message id), and otherwise fails
UNAVAILABLE, which clients retry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Container
from functools import partial
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from rocketmq.grpc_protocol import definition_pb2 as pb

from protocols.rocketmq_grpc.proxy_rules import RESENDABLE, REWRITTEN, endpoints_of, method_kinds, named_here

from .failover_counts import FailoverCounts
from .leader_lookup import LeaderLookup

log = logging.getLogger("tidemq.cluster")

HOLD_S = 2.0  # how long a call without a deadline waits for a leader
MARGIN_S = 0.3  # of a call's deadline, left for the leader to answer
READY_STEP_S = 0.5  # a leader's address is looked up again after this long without a connection
STOP_GRACE_S = 2.0
LOST = "the store leader was lost with this call under way (it may have been done): a store failover is under way"
NO_LEADER = "no store leader yet: a store failover is under way"
HOP_HEADERS = ("user-agent", "grpc-", ":")  # metadata of this hop, not the caller's

Target = Callable[[], Awaitable[tuple[str, int]]]


class GrpcProxy(grpc.GenericRpcHandler):
    """The gateway node's gRPC server; ``leader_moved`` sends the next calls to the new leader."""

    def __init__(self, target: Target) -> None:
        self.target = LeaderLookup(target)  # (shared by concurrent calls: one etcd lookup at a time)
        self.kinds = method_kinds()
        self.endpoints = endpoints_of("127.0.0.1", 0)  # the plain port's, as routes name it
        self.tls_endpoints = self.endpoints  # ... the TLS port's, for calls that came over TLS
        self.shared_endpoints = self.endpoints  # ... the remoting port's, for calls that came over it
        self.forwarded: Container[str] = ()  # the peers of connections forwarded from the remoting port
        self.targets: dict[bool, tuple[str, int]] = {}  # TLS or not -> where this host reaches the port
        self.server: grpc.aio.Server | None = None
        self.address: tuple[str, int] | None = None  # the leader's gRPC address, while it answers
        self.channel: grpc.aio.Channel | None = None
        self._closing: set[asyncio.Task[None]] = set()  # old leaders' channels, closing
        self.counts = FailoverCounts()

    async def start(self, plain: tuple[str, int, str] | None, tls: tuple[str, int, str] | None,
                    key_and_chain: tuple[bytes, bytes] | None = None) -> list[tuple[str, str, int]]:
        """Listening on ``plain`` and ``tls`` (each HOST, PORT, the host routes name; TLS with
        the PEM ``key_and_chain``): each listener's (name, advertised host, port)."""
        self.server = grpc.aio.server()
        started = []
        for name, bind in (("grpc", plain), ("grpcs", tls)):
            if bind is None:
                continue
            host, port, advertised_host = bind
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            if name == "grpcs":
                assert key_and_chain is not None
                bound = self.server.add_secure_port(address, grpc.ssl_server_credentials([key_and_chain]))
            else:
                bound = self.server.add_insecure_port(address)
            if bound == 0:
                raise OSError(f"{name}_bind: cannot listen on {address}")
            loopback = "127.0.0.1" if host in ("0.0.0.0", "localhost", "") else "::1" if host == "::" else host
            self.targets[name == "grpcs"] = (loopback, bound)
            if name == "grpcs":
                self.tls_endpoints = endpoints_of(advertised_host, bound)
            else:
                self.endpoints = endpoints_of(advertised_host, bound)
            started.append((name, advertised_host, bound))
        if plain is None:
            self.endpoints = self.tls_endpoints
        elif tls is None:
            self.tls_endpoints = self.endpoints
        self.server.add_generic_rpc_handlers((self,))
        await self.server.start()
        return started

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(STOP_GRACE_S)
            self.server = None
        self._forget()
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=STOP_GRACE_S)

    def leader_moved(self) -> None:
        self._forget()

    def _forget(self) -> None:
        if self.channel is not None:
            task = asyncio.ensure_future(self.channel.close(grace=STOP_GRACE_S))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        self.channel, self.address = None, None

    # -- grpc.GenericRpcHandler ----------------------------------------------------------------
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        kind = self.kinds.get(method)
        if kind is None:
            return None  # (UNIMPLEMENTED)
        # (partials of coroutine and async generator functions: grpc.aio runs them on the loop)
        if kind == (False, False):
            return grpc.unary_unary_rpc_method_handler(partial(self._unary, method))
        if kind == (False, True):
            return grpc.unary_stream_rpc_method_handler(partial(self._stream, method))
        if kind == (True, True):
            return grpc.stream_stream_rpc_method_handler(partial(self._bidi, method))
        return None

    # -- calls ---------------------------------------------------------------------------------
    async def _unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        deadline = self._deadline(context)
        while True:
            channel = await self._leader(context, deadline)
            try:
                answer = await channel.unary_unary(method)(request, metadata=self._metadata(context),
                                                          timeout=self._timeout(context))
            except grpc.aio.AioRpcError as exc:
                if not self._leader_lost(exc, channel):
                    await context.abort(exc.code(), exc.details() or "")
                self._lost(channel)
                if method not in RESENDABLE or time.monotonic() >= deadline:
                    self.counts.lost += 1
                    await context.abort(grpc.StatusCode.UNAVAILABLE, LOST)
                self.counts.resent += 1
                continue
            if method not in REWRITTEN:
                return answer
            try:
                return named_here(method, answer, self._endpoints(context))
            except DecodeError as exc:  # (passed on, it would send the client to the store node)
                await context.abort(grpc.StatusCode.INTERNAL, f"the store node's answer does not decode: {exc}")

    async def _stream(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        channel = await self._leader(context, self._deadline(context))
        call = channel.unary_stream(method)(request, metadata=self._metadata(context), timeout=self._timeout(context))
        async for answer in self._answers(call, channel, context):
            yield answer

    async def _bidi(self, method: str, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                    ) -> AsyncIterator[bytes]:
        """A stream (Telemetry): ended UNAVAILABLE with its leader; the client opens it again."""
        channel = await self._leader(context, self._deadline(context))
        call = channel.stream_stream(method)(requests, metadata=self._metadata(context))
        try:
            async for answer in self._answers(call, channel, context):
                yield answer
        finally:
            call.cancel()

    async def _answers(self, call: AsyncIterator[bytes], channel: grpc.aio.Channel,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """A streamed call's answers passed on; its failure ends the client's call the same way
        (UNAVAILABLE when the leader was lost under it)."""
        try:
            async for answer in call:
                yield answer
        except grpc.aio.AioRpcError as exc:
            if self._leader_lost(exc, channel):
                self._lost(channel)
                self.counts.lost += 1
                await context.abort(grpc.StatusCode.UNAVAILABLE, LOST)
            await context.abort(exc.code(), exc.details() or "")

    def _endpoints(self, context: grpc.aio.ServicerContext) -> pb.Endpoints:
        """This node's endpoint the call came to (plain or TLS port, or the remoting port)."""
        if context.peer() in self.forwarded:
            return self.shared_endpoints
        if context.auth_context().get("transport_security_type") == [b"ssl"]:
            return self.tls_endpoints
        return self.endpoints

    # -- the leader ----------------------------------------------------------------------------
    async def _leader(self, context: grpc.aio.ServicerContext, deadline: float) -> grpc.aio.Channel:
        """A channel to the leader, connected; the call aborted UNAVAILABLE past ``deadline``."""
        why = ""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.counts.no_leader += 1
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"{NO_LEADER}{why}")
            try:
                if self.channel is None:
                    address = await asyncio.wait_for(self.target(), remaining)
                    if self.channel is None:  # (not opened by another call meanwhile)
                        host, port = address
                        self.address = address
                        self.channel = grpc.aio.insecure_channel(f"[{host}]:{port}" if ":" in host
                                                                 else f"{host}:{port}")
                channel = self.channel
                await asyncio.wait_for(channel.channel_ready(), min(remaining, READY_STEP_S))
                return channel
            except (OSError, asyncio.TimeoutError) as exc:
                log.debug("grpc proxy: no store leader yet error=%s", exc)
                why = f" ({exc})" if isinstance(exc, OSError) else why
                if self.channel is not None:
                    self._lost(self.channel)
                await asyncio.sleep(0.05)

    def _leader_lost(self, exc: grpc.aio.AioRpcError, channel: grpc.aio.Channel) -> bool:
        """Whether a call failed with its leader: unreachable, or its channel closed by
        ``leader_moved`` (a stopped old leader answers nothing)."""
        return exc.code() == grpc.StatusCode.UNAVAILABLE or (
            exc.code() == grpc.StatusCode.CANCELLED and channel is not self.channel)

    def _lost(self, channel: grpc.aio.Channel) -> None:
        if channel is self.channel:
            log.info("grpc proxy: store leader lost address=%s", self.address)
            self._forget()

    @staticmethod
    def _deadline(context: grpc.aio.ServicerContext) -> float:
        remaining = context.time_remaining()
        wait = HOLD_S if remaining is None else max(0.0, remaining - MARGIN_S)
        return time.monotonic() + wait

    @staticmethod
    def _timeout(context: grpc.aio.ServicerContext) -> float | None:
        return context.time_remaining()

    @staticmethod
    def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...]:
        return tuple((key, value) for key, value in context.invocation_metadata() or ()
                     if not key.startswith(HOP_HEADERS))
