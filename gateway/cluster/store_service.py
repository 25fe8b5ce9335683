"""The store node's side of the store link (``--role store``): the store served to gateway
nodes over the remoting port, beside RocketMQ clients, with the private request codes of
``protocols.cluster.store_link``.

Each handler answers at once from the store, except PUT (answered when the put is durable, as
a RocketMQ send) and SUBSCRIBE_NOTIFY (the connection then receives one-way NOTIFY requests,
coalesced per queue, for as long as it lasts).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from protocols.cluster.store_link import (
    StoreCode,
    decode_names,
    decode_put,
    encode_items,
    encode_messages,
    encode_offsets,
    encode_put_results,
    result_fields,
)
from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import FLAG_ONEWAY, RemotingCommand, response_to
from store import MessageStore, PutResult

from ..remoting.requests import BadRequest, Pending, Reply, int_field, str_field

if TYPE_CHECKING:
    from ..remoting.connection import RemotingConnection

log = logging.getLogger("tidemq.cluster")

MAX_GET_MESSAGES = 1024
MAX_KV_ITEMS = 100_000

class StoreService:
    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.notify_subscribers = 0

    def handlers(self) -> dict[int, object]:
        return {
            StoreCode.HELLO: self.hello,
            StoreCode.PUT: self.put,
            StoreCode.GET: self.get,
            StoreCode.READ_AT: self.read_at,
            StoreCode.OFFSETS: self.offsets,
            StoreCode.COMMIT_OFFSET: self.commit_offset,
            StoreCode.GET_OFFSET: self.get_offset,
            StoreCode.KV_GET: self.kv_get,
            StoreCode.KV_PUT: self.kv_put,
            StoreCode.KV_DELETE: self.kv_delete,
            StoreCode.KV_ITEMS: self.kv_items,
            StoreCode.SUBSCRIBE_NOTIFY: self.subscribe_notify,
        }

    def hello(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        options = self.store.options
        return response_to(request, ResponseCode.SUCCESS, ext_fields={
            "idPrefix": self.store.msg_id_prefix, "maxMessageSize": str(options.max_message_size)})

    def put(self, conn: RemotingConnection, request: RemotingCommand) -> Reply:
        items = decode_put(request.body)
        if not items:
            raise BadRequest("a PUT with no message")
        queues = [names for _, names in items]
        future = self.store.put_batch_nowait(items)

        def respond(results: list[PutResult]) -> RemotingCommand:
            return response_to(request, ResponseCode.SUCCESS, body=encode_put_results(results, queues))
        return Pending(future, respond)

    def get(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        tags = ext.get("tags")
        try:
            tag_hashes = frozenset(int(t) for t in tags.split(",") if t) if tags is not None else None
        except ValueError:
            raise BadRequest("the tags field is not a list of numbers") from None
        result = self.store.get_now(str_field(ext, "queue"), int_field(ext, "offset"),
                                    max(1, min(int_field(ext, "max"), MAX_GET_MESSAGES)),
                                    int_field(ext, "maxBytes", 4 << 20), tag_hashes)
        body = encode_messages(result.messages, self.store.raw_records(result.messages)) if result.messages else b""
        return response_to(request, ResponseCode.SUCCESS, ext_fields=result_fields(result), body=body)

    def read_at(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        message = self.store.read_at(int_field(request.ext_fields, "position"))
        if message is None:
            return response_to(request, ResponseCode.SUCCESS, ext_fields={"found": "false"})
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"found": "true"},
                           body=encode_messages([message], self.store.raw_records([message])))

    def offsets(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        """Body: queue names; answer: ``max`` in the body, ``min`` offsets in a second part."""
        store = self.store
        names = decode_names(request.body)
        highs = {name: store.max_offset_now(name) for name in names}
        lows = {name: store.min_offset_now(name) for name in names}
        high, low = encode_offsets(highs), encode_offsets(lows)
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"split": str(len(high))}, body=high + low)

    def commit_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        self.store.commit_offset_now(str_field(ext, "consumer"), str_field(ext, "queue"), int_field(ext, "offset"))
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def get_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        offset = self.store.get_offset_now(str_field(ext, "consumer"), str_field(ext, "queue"))
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"offset": str(-1 if offset is None else offset)})

    def kv_get(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        value = self.store.table(str_field(ext, "table")).get(str_field(ext, "key"))
        if value is None:
            return response_to(request, ResponseCode.SUCCESS, ext_fields={"found": "false"})
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"found": "true"}, body=value)

    def kv_put(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        self.store.table(str_field(ext, "table")).put(str_field(ext, "key"), request.body)
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def kv_delete(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        self.store.table(str_field(ext, "table")).delete(str_field(ext, "key"))
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def kv_items(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        table = self.store.table(str_field(ext, "table"))
        items = []
        for item in table.items(ext.get("prefix", "")):
            items.append(item)
            if len(items) >= MAX_KV_ITEMS:
                break
        return response_to(request, ResponseCode.SUCCESS, body=encode_items(items))

    def subscribe_notify(self, conn: RemotingConnection, request: RemotingCommand) -> Reply:
        return self._feed_notify(conn, request)

    async def _feed_notify(self, conn: RemotingConnection, request: RemotingCommand) -> None:
        """Answer, then forward every notify event to ``conn`` until it closes."""
        conn.send(response_to(request, ResponseCode.SUCCESS))
        conn.flush()
        subscription = self.store.subscribe_notify()
        self.notify_subscribers += 1
        log.info("gateway node subscribed to notify peer=%s", conn.peer)
        try:
            async for queue, max_offset in subscription:
                events = {queue: max_offset}
                events.update(subscription.drain())
                conn.send(RemotingCommand(StoreCode.NOTIFY, flag=FLAG_ONEWAY, body=encode_offsets(events)))
                conn.flush()
                await asyncio.sleep(0)  # let the other subscribers' events coalesce meanwhile
        finally:
            subscription.close()
            self.notify_subscribers -= 1
