"""Message queries: QUERY_MESSAGE (by key, through the store's key index) and
VIEW_MESSAGE_BY_ID (by commitlog offset). Mixed into ``RemotingBroker``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand, response_to
from protocols.remoting.message_codec import encode_message
from store import StoredMessage
from store import HELD

from ..interop import remoting_topic_of
from .broker_parts import BrokerParts
from .messages import to_wire
from .requests import int_field, str_field

if TYPE_CHECKING:
    from .connection import RemotingConnection


class QueryRequests(BrokerParts):
    def _wire_of(self, message: StoredMessage, topic_hint: str | None = None):
        for queue, offset in message.queues:
            place = remoting_topic_of(queue)
            if place is not None and (topic_hint is None or place[0] == topic_hint):
                if offset != HELD:  # (a held message's offsets come with its release, not in its record)
                    message.queue_offset = offset
                return to_wire(message, place[0], place[1], self.origin)
        return to_wire(message, topic_hint or message.topic, 0, self.origin)

    def query_message(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        topic, key = str_field(ext, "topic"), str_field(ext, "key")
        max_num = max(1, min(int_field(ext, "maxNum", 32), 64))
        begin, end = int_field(ext, "beginTimestamp", 0), int_field(ext, "endTimestamp", 1 << 62)
        found = self.store.query_by_key(self._record_topic(topic, {}), key, max_messages=max_num,
                                        begin_ms=begin, end_ms=end)
        found = [m for m in found if self.access.may_read(conn.principal, m)]  # (access.py)
        if not found:
            return response_to(request, ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
        body = b"".join(encode_message(self._wire_of(m, topic)) for m in found)
        return response_to(request, ResponseCode.SUCCESS, body=body, ext_fields={
            "indexLastUpdateTimestamp": str(found[-1].store_timestamp),
            "indexLastUpdatePhyoffset": str(found[-1].position)})

    def view_message(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        position = int_field(request.ext_fields, "offset")
        message = self.store.read_at(position)
        if message is None:
            return response_to(request, ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {position}")
        self.access.check_read(conn.principal, message, "view")
        return response_to(request, ResponseCode.SUCCESS, body=encode_message(self._wire_of(message)))
