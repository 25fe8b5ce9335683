"""UPDATE_AND_CREATE_TOPIC (mqadmin updateTopic, a client's createTopic): the topic the request
asks for, made when it can be honoured -- read and write queue counts, read and write
permission -- and refused otherwise with SYSTEM_ERROR and a remark, as RocketMQ's broker
refuses a topic config it cannot take: never SUCCESS for a change not made. Fields a request
leaves out keep the topic as it is (or as a lookup would create it). Mixed into
``RemotingBroker``."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand, response_to

from ..interop import remoting_queue
from .access import Right
from .broker_parts import BrokerParts
from .requests import BadRequest, int_field, str_field
from .topics import PERM_READ, PERM_WRITE, TopicConfig

if TYPE_CHECKING:
    from .connection import RemotingConnection

MAX_QUEUES = 1024  # per topic: every consumer rebalances over them
BUILT_PERMS = PERM_READ | PERM_WRITE
BUILT_FILTER_TYPE = "SINGLE_TAG"


def _refuse(remark: str) -> BadRequest:
    return BadRequest(remark, ResponseCode.SYSTEM_ERROR)


def requested_config(ext: dict[str, str], base: TopicConfig) -> TopicConfig:
    """The topic the request's header asks for, ``base`` where it says nothing; BadRequest
    for settings that are not built or would leave messages where no consumer reads them."""
    read = int_field(ext, "readQueueNums", base.read_queues)
    write = int_field(ext, "writeQueueNums", base.write_queues)
    perm = int_field(ext, "perm", base.perm)
    for field, count in (("readQueueNums", read), ("writeQueueNums", write)):
        if not 1 <= count <= MAX_QUEUES:
            raise _refuse(f"{field} {count} is not within 1..{MAX_QUEUES}")
    if write > read:
        raise _refuse(f"writeQueueNums {write} above readQueueNums {read}: messages would go to queues "
                      "no consumer reads")
    if perm & ~BUILT_PERMS:
        raise _refuse(f"perm {perm} is not built: only PERM_READ (4) and PERM_WRITE (2)")
    if ext.get("topicFilterType", BUILT_FILTER_TYPE) != BUILT_FILTER_TYPE:
        raise _refuse(f"topicFilterType {ext['topicFilterType']} is not built: only {BUILT_FILTER_TYPE}")
    if int_field(ext, "topicSysFlag", 0):
        raise _refuse("topicSysFlag (unit topics) is not built: only 0")
    if ext.get("order", "false") != "false":
        raise _refuse("ordered topic configs are not built: send ordered messages with a queue selector "
                      "or a sharding key")
    if ext.get("attributes"):
        raise _refuse(f"topic attributes are not built: {ext['attributes']}")
    return replace(base, read_queues=read, write_queues=write, perm=perm)


class TopicUpdateRequests(BrokerParts):
    def create_topic(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        ext = request.ext_fields
        name = str_field(ext, "topic")
        current = self.topics.get(name)
        try:
            base = current if current is not None else self.topics.new_config(name)
        except ValueError as exc:
            raise _refuse(str(exc)) from None
        wanted = requested_config(ext, base)
        if wanted == base and current is not None:
            return response_to(request, ResponseCode.SUCCESS)  # (nothing to change)
        if wanted != base:  # (more than a lookup would do: the ACL's CONFIGURE right)
            self.access.check_topic(conn.principal, name, Right.CONFIGURE, "update_topic")
        if current is not None and wanted.read_queues < current.read_queues:
            self._check_unread_queues_empty(current, wanted.read_queues)
        self.topics.put(wanted)
        return response_to(request, ResponseCode.SUCCESS)

    def _check_unread_queues_empty(self, topic: TopicConfig, read_queues: int) -> None:
        """Fewer read queues leave the others' messages to no consumer: only empty ones go."""
        for queue_id in range(read_queues, topic.read_queues):
            queue = remoting_queue(topic.name, queue_id)
            if self.store.max_offset_now(queue) > self.store.min_offset_now(queue):
                raise _refuse(f"readQueueNums {read_queues} below {topic.read_queues}: queue {queue_id} of "
                              f"{topic.name} still holds messages (lower writeQueueNums first; readQueueNums "
                              "once retention has removed them)")
