"""RemoteStore: a gateway node's handle on the store of a store node, over the store link.

The asynchronous part of ``store.MessageStore``'s API, the same names and results, so the
gateways can run on either: puts (answered when durable on the store node), reads by queue and
offset, reads by position, offsets, consumer offsets, KV tables, and notify events.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any

from .store_link import (
    StoreCode,
    StoreLinkError,
    decode_items,
    decode_messages,
    decode_offsets,
    decode_put_results,
    decode_result,
    encode_names,
    encode_put,
    get_fields,
)
from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand
from store import GetResult, Message, PutResult, StoredMessage, StoreError

from .link import DEFAULT_TIMEOUT_S, Link

log = logging.getLogger("tidemq.cluster")


class RemoteStoreError(StoreError):
    """The store node refused a request or could not be reached. ``retryable``: it was not
    reached, or said to try again (not the leader now, too few replicas in sync): the same
    request may succeed on the next link (``GatewayStore`` retries it through a failover)."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


# a store node's answers that mean "not now": another link (the new leader) may take the request
_TRY_AGAIN = frozenset({ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SYSTEM_BUSY})


def _check(response: RemotingCommand) -> RemotingCommand:
    if response.code != ResponseCode.SUCCESS:
        raise RemoteStoreError(f"store node answered {response.code}: {response.remark}",
                               retryable=response.code in _TRY_AGAIN)
    return response


_POSITIONS_ONLY = {"offsets": "0"}


def _unreachable(exc: BaseException) -> RemoteStoreError:
    return RemoteStoreError(f"store node not reachable: {exc}", retryable=True)


class RemoteStore:
    def __init__(self, link: Link, id_prefix: str, max_message_size: int) -> None:
        self.link = link
        self.msg_id_prefix = id_prefix
        self.max_message_size = max_message_size
        self._notify_handlers: list[Callable[[dict[str, int]], None]] = []
        self.amqp_port = 0  # the store node's AMQP listener (gateway nodes relay AMQP there)
        self.grpc_port = 0  # ... and its gRPC listener (gateway nodes proxy gRPC calls there)
        # disconnect a client here and save its session (in order on the link) before the answer
        self.on_kick: Callable[[str], bool] | None = None
        link.on_request = self._on_request
        self.address: tuple[str, int] | None = None  # where it was linked to (connect)

    @classmethod
    async def connect(cls, host: str, port: int, name: str = "store", token: str = "") -> RemoteStore:
        link = await Link.connect(host, port, name)
        try:
            hello = _check(await link.call(StoreCode.HELLO, {"token": token} if token else None))
            store = cls(link, hello.ext_fields["idPrefix"], int(hello.ext_fields["maxMessageSize"]))
            store.amqp_port = int(hello.ext_fields.get("amqpPort") or 0)
            store.grpc_port = int(hello.ext_fields.get("grpcPort") or 0)
            store.address = (host, port)
            return store
        except BaseException:
            link.close()
            raise

    async def close(self) -> None:
        self.link.close()
        await self.link.closed

    # -- writing ------------------------------------------------------------------------------
    def put_batch_nowait(self, items: Iterable[tuple[Message, Sequence[str]]], *, queue_offsets: bool = True,
                         producer: tuple[str, int] | None = None,
                         stored: Callable[[Sequence[PutResult]], None] | None = None,
                         ) -> asyncio.Future[Sequence[PutResult]]:
        """``queue_offsets`` False: results without them (cheaper on both nodes), for callers
        that read only positions (an MQTT gateway node). ``producer``: (id, sequence number),
        an idempotent put (store/write/idempotence.py: sent again, it is not written twice).
        ``stored``: called with the results as the answer is read, before what the link reads
        after it (a notify) is handled, and before the future's callbacks run."""
        fields = None if queue_offsets else _POSITIONS_ONLY
        if producer is not None:
            fields = {**(fields or {}), "producer": producer[0], "seq": str(producer[1])}
        response = self.link.request(StoreCode.PUT, fields, encode_put(items))
        result: asyncio.Future[Sequence[PutResult]] = asyncio.get_running_loop().create_future()

        def done(f: asyncio.Future[RemotingCommand]) -> None:
            if result.done():
                return
            if f.cancelled():
                result.cancel()
                return
            try:
                reply = _check(f.result())
                results = decode_put_results(reply.body, self.msg_id_prefix)
                if stored is not None:
                    stored(results)
                result.set_result(results)
            except (ConnectionError, StoreError, StoreLinkError) as exc:
                result.set_exception(exc if isinstance(exc, StoreError) else
                                     _unreachable(exc) if isinstance(exc, ConnectionError) else RemoteStoreError(str(exc)))
        response.add_done_callback(done)
        return result

    async def put_batch(self, items: Iterable[tuple[Message, Sequence[str]]]) -> Sequence[PutResult]:
        return await self.put_batch_nowait(items)

    async def put(self, message: Message, queues: Sequence[str]) -> PutResult:
        return (await self.put_batch_nowait([(message, queues)]))[0]

    # -- reading ------------------------------------------------------------------------------
    async def get(self, queue: str, offset: int, max_messages: int = 32, max_bytes: int = 4 << 20,
                  tag_hashes: frozenset[int] | None = None) -> GetResult:
        reply = _check(await self._call(StoreCode.GET, get_fields(queue, offset, max_messages, max_bytes,
                                                                   tag_hashes)))
        return decode_result(reply.ext_fields, reply.body, self.msg_id_prefix, queue)

    async def read_at(self, position: int) -> StoredMessage | None:
        reply = _check(await self._call(StoreCode.READ_AT, {"position": str(position)}))
        if reply.ext_fields.get("found") != "true":
            return None
        return decode_messages(reply.body, self.msg_id_prefix, "")[0]

    async def offsets(self, queues: Iterable[str]) -> dict[str, tuple[int, int]]:
        """queue -> (min offset, max offset)."""
        reply = _check(await self._call(StoreCode.OFFSETS, body=encode_names(queues)))
        split = int(reply.ext_fields.get("split", "0"))
        highs, lows = decode_offsets(reply.body[:split]), decode_offsets(reply.body[split:])
        return {queue: (lows.get(queue, 0), high) for queue, high in highs.items()}

    async def max_offset(self, queue: str) -> int:
        return (await self.offsets([queue]))[queue][1]

    async def min_offset(self, queue: str) -> int:
        return (await self.offsets([queue]))[queue][0]

    # -- consumer offsets and KV tables -------------------------------------------------------
    def commit_offset_nowait(self, consumer: str, queue: str, offset: int, *, durable: bool = False) -> None:
        """Sent in order with everything else on the link; not answered. ``durable``: the store
        node writes it through at once (a group's start), not with its offset checkpoint."""
        fields = {"consumer": consumer, "queue": queue, "offset": str(offset)}
        if durable:
            fields["durable"] = "1"
        self._oneway(StoreCode.COMMIT_OFFSET, fields)

    async def commit_offset(self, consumer: str, queue: str, offset: int) -> None:
        _check(await self._call(StoreCode.COMMIT_OFFSET, {"consumer": consumer, "queue": queue,
                                                          "offset": str(offset)}))

    async def get_offset(self, consumer: str, queue: str) -> int | None:
        reply = _check(await self._call(StoreCode.GET_OFFSET, {"consumer": consumer, "queue": queue}))
        offset = int(reply.ext_fields.get("offset", "-1"))
        return None if offset < 0 else offset

    async def kv_get(self, table: str, key: str) -> bytes | None:
        reply = _check(await self._call(StoreCode.KV_GET, {"table": table, "key": key}))
        return reply.body if reply.ext_fields.get("found") == "true" else None

    async def kv_put(self, table: str, key: str, value: bytes) -> None:
        _check(await self._call(StoreCode.KV_PUT, {"table": table, "key": key}, value))

    def kv_put_sent(self, table: str, key: str, value: bytes) -> Coroutine[Any, Any, None]:
        """``kv_put`` sent now -- ahead of whatever is sent after it on the link, one-way requests
        included -- and awaited later: the coroutine returns once the store node wrote it."""
        return self._answer(self.link.request(StoreCode.KV_PUT, {"table": table, "key": key}, value))

    def kv_put_nowait(self, table: str, key: str, value: bytes) -> None:
        """Sent in order with everything else on the link; not answered."""
        self._oneway(StoreCode.KV_PUT, {"table": table, "key": key}, value)

    def kv_delete_nowait(self, table: str, key: str) -> None:
        self._oneway(StoreCode.KV_DELETE, {"table": table, "key": key})

    def kv_delete_sent(self, table: str, key: str) -> Coroutine[Any, Any, None]:
        """``kv_delete`` sent now, in order on the link, and awaited later (as ``kv_put_sent``)."""
        return self._answer(self.link.request(StoreCode.KV_DELETE, {"table": table, "key": key}))

    async def kv_delete(self, table: str, key: str) -> None:
        _check(await self._call(StoreCode.KV_DELETE, {"table": table, "key": key}))

    async def kv_items(self, table: str, prefix: str = "") -> list[tuple[str, bytes]]:
        reply = _check(await self._call(StoreCode.KV_ITEMS, {"table": table, "prefix": prefix}))
        return decode_items(reply.body)

    # -- MQTT wildcard filters and retained messages (kept by the store node) -----------------
    def filter_hold(self, topic_filter: str, holder: str, durable: bool) -> None:
        self._oneway(StoreCode.FILTER_HOLD, {"filter": topic_filter, "holder": holder,
                                                 "durable": "true" if durable else "false"})

    def filter_release(self, topic_filter: str, holder: str) -> None:
        self._oneway(StoreCode.FILTER_RELEASE, {"filter": topic_filter, "holder": holder})

    def retained_set(self, topic: str, position: int | None) -> asyncio.Future[None]:
        """Sent now, in order on the link; the future resolves once the store node answers
        (after the change is held as its store promises), or fails (RemoteStoreError)."""
        return asyncio.ensure_future(self._answer(self.link.request(
            StoreCode.RETAINED_SET, {"topic": topic, "position": str(-1 if position is None else position)})))

    async def retained_match(self, topic_filter: str) -> list[StoredMessage]:
        reply = _check(await self._call(StoreCode.RETAINED_MATCH, {"filter": topic_filter}))
        return decode_messages(reply.body, self.msg_id_prefix, "")

    # -- notify -------------------------------------------------------------------------------
    async def subscribe_notify(self, handler: Callable[[dict[str, int]], None], node_id: str = "") -> None:
        """``handler({queue: max_offset, ...})`` for the notify batches the store node routes
        to this node (``node_id``); see ``interest``."""
        self._notify_handlers.append(handler)
        if len(self._notify_handlers) == 1:
            _check(await self._call(StoreCode.SUBSCRIBE_NOTIFY, {"nodeId": node_id} if node_id else None))

    def interest(self, queue: str, reading: bool) -> None:
        """Tell the store node this node starts (stops) reading ``queue``: sent before anything
        else this node then asks about the queue, so no later event misses it."""
        self._oneway(StoreCode.INTEREST, {"queue": queue, "reading": "true" if reading else "false"})

    async def takeover(self, client_id: str, node: str) -> int:
        """Have ``client_id`` disconnected on ``node`` (``*``: on every other node) with its
        session saved; returns on how many nodes it was."""
        reply = _check(await self._call(StoreCode.TAKEOVER, {"clientId": client_id, "node": node}))
        return int(reply.ext_fields.get("kicked", "0"))

    def _on_request(self, command: RemotingCommand) -> None:
        if command.code == StoreCode.CLIENT_KICK:
            kicked = self.on_kick(command.ext_fields.get("clientId", "")) if self.on_kick else False
            self.link.respond(command, ResponseCode.SUCCESS, {"kicked": "true" if kicked else "false"})
            return
        if command.code != StoreCode.NOTIFY:
            log.warning("unexpected request from the store node code=%d", command.code)
            return
        try:
            events = decode_offsets(command.body)
        except StoreLinkError as exc:
            log.error("bad notify from the store node error=%s", exc)
            return
        for handler in self._notify_handlers:
            handler(events)

    def _oneway(self, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"") -> None:
        """A one-way request; dropped, with a log line, while the link is down (what it would
        have written -- a session's state, a filter hold -- is written again when the client
        comes back, through whichever node)."""
        try:
            self.link.oneway(code, ext_fields, body)
        except ConnectionError:
            log.warning("store node unreachable, one-way request dropped code=%d", code)

    async def _answer(self, sent: asyncio.Future[RemotingCommand]) -> None:
        try:
            _check(await asyncio.wait_for(asyncio.shield(sent), DEFAULT_TIMEOUT_S))
        except (ConnectionError, TimeoutError) as exc:
            sent.cancel()
            raise _unreachable(exc) from None

    async def _call(self, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
        try:
            return await self.link.call(code, ext_fields, body)
        except (ConnectionError, TimeoutError) as exc:
            raise _unreachable(exc) from None
