"""Consumer offsets and queue bounds: QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET,
GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME, on a
topic queue (``r:{topic}:{queueId}``). Mixed into ``RemotingBroker``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand, response_to
from store import GetStatus

from ..interop import remoting_queue
from .broker_parts import BrokerParts
from .requests import CONSUMER_PREFIX, int_field, str_field

if TYPE_CHECKING:
    from .connection import RemotingConnection


class OffsetRequests(BrokerParts):
    def _queue_of(self, ext: dict[str, str]) -> tuple[str, str]:
        topic = str_field(ext, "topic")
        return topic, remoting_queue(topic, int_field(ext, "queueId"))

    def query_consumer_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        group = str_field(ext, "consumerGroup")
        _, queue = self._queue_of(ext)
        offset = self.store.get_offset_now(CONSUMER_PREFIX + group, queue)
        if offset is None:
            # As RocketMQ's broker: a group new to a queue whose first message is still there
            # starts from 0 (so messages sent before the first consumer started are consumed);
            # otherwise the client's consumeFromWhere decides.
            if self.store.max_offset_now(queue) == 0 or self._min_offset(queue) > 0:
                return response_to(request, ResponseCode.QUERY_NOT_FOUND,
                                   "Not found, maybe this group consumer boot first")
            offset = 0
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    def _min_offset(self, queue: str) -> int:
        result = self.store.get_now(queue, -1, 1)
        return result.min_offset

    def update_consumer_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        group = str_field(ext, "consumerGroup")
        _, queue = self._queue_of(ext)
        offset = int_field(ext, "commitOffset")
        if offset >= 0:  # clients report -1 for queues they hold no position in: nothing to keep
            self.store.commit_offset_now(CONSUMER_PREFIX + group, queue, offset)
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def get_max_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        _, queue = self._queue_of(request.ext_fields)
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"offset": str(self.store.max_offset_now(queue))})

    def get_min_offset(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        _, queue = self._queue_of(request.ext_fields)
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"offset": str(self._min_offset(queue))})

    async def search_offset_by_timestamp(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        _, queue = self._queue_of(ext)
        offset = await self.store.offset_for_timestamp(queue, int_field(ext, "timestamp"))
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})

    def get_earliest_store_time(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        _, queue = self._queue_of(request.ext_fields)
        first = self.store.get_now(queue, self._min_offset(queue), 1)
        if first.status is not GetStatus.FOUND:
            return response_to(request, ResponseCode.SYSTEM_ERROR, "the queue has no message")
        return response_to(request, ResponseCode.SUCCESS,
                           ext_fields={"timestamp": str(first.messages[0].store_timestamp)})

