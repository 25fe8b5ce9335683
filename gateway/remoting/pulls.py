"""PULL_MESSAGE: reads of a topic queue through the subscription's selector, long polling
when there is nothing to deliver, and the pull response. Mixed into ``RemotingBroker``.

A TAG selector is applied by the store on the consume-queue entries (the commitlog is not
read for other tags). A SQL92 selector needs the properties: messages are read as any
reader reads them (through the queue cache) and the ones that do not match are skipped; a
pull scans on past them up to a budget, as RocketMQ's getMessage does, and when it reaches
the queue's end the pull is held there, past what it skipped (RocketMQ's hold service also
keeps a pull waiting while what arrives does not match).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncio

from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand, response_to
from protocols.remoting.headers import PullMessageHeader
from protocols.remoting.message_codec import encode_message
from protocols.remoting.sql92 import SqlFilter
from store import GetResult, GetStatus

from ..interop import remoting_queue
from .broker_parts import BrokerParts
from .messages import shown_properties, to_wire
from .requests import CONSUMER_PREFIX, BadRequest, Reply
from .selectors import Selector
from .topics import PERM_READ

if TYPE_CHECKING:
    from .connection import RemotingConnection

# PullSysFlag
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
MAX_PULL_MESSAGES = 64
MAX_PULL_BYTES = 4 << 20
# a SQL92 pull reads at most this much (messages, bytes) looking for a match before it answers
SQL_SCAN_MESSAGES = 800
SQL_SCAN_BYTES = 16 << 20


class PullRequests(BrokerParts):
    def _readable(self, topic: str, queue_id: int) -> str:
        config = self.topics.get(topic)
        if config is None:
            raise BadRequest(f"topic[{topic}] not exist, apply first please!", ResponseCode.TOPIC_NOT_EXIST)
        if not config.perm & PERM_READ:
            raise BadRequest(f"the topic {topic} is not readable", ResponseCode.NO_PERMISSION)
        if queue_id < 0 or queue_id >= config.read_queues:
            raise BadRequest(f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                             f"[{config.read_queues}]")
        return remoting_queue(topic, queue_id)

    def _selector(self, header: PullMessageHeader) -> Selector:
        """What the pull asks for: the subscription it carries, else its group's (heartbeat)."""
        if header.sys_flag & FLAG_SUBSCRIPTION or header.subscription:
            return self.selectors.get(header.subscription, header.expression_type)
        sub = self.groups.subscription(header.consumer_group, header.topic)
        if sub is None:
            return self.selectors.get("*", None)
        return self.selectors.get(sub.expression, sub.expression_type)

    def _read(self, queue: str, topic: str, offset: int, max_messages: int, selector: Selector) -> GetResult:
        """A read through the selector. NO_NEW_MESSAGE's ``next_offset`` may lie past ``offset``
        (everything up to the end was skipped); NO_MATCHED_MESSAGE: a scan matched nothing
        and did not reach the end."""
        if selector.sql is not None:
            return self._read_matching(queue, topic, offset, max_messages, selector.sql)
        if selector.tag_codes is None:
            return self.cache.read(queue, offset, max_messages, MAX_PULL_BYTES)
        result = self.store.get_now(queue, offset, max_messages, MAX_PULL_BYTES, tag_hashes=selector.tag_codes)
        if result.status is GetStatus.NO_MATCHED_MESSAGE and result.next_offset >= result.max_offset:
            return GetResult(GetStatus.NO_NEW_MESSAGE, [], result.next_offset, result.min_offset,
                             result.max_offset)  # (scanned to the end: wait there)
        return result

    def _read_matching(self, queue: str, topic: str, offset: int, max_messages: int, sql: SqlFilter) -> GetResult:
        scanned = scanned_bytes = 0
        while True:
            result = self.cache.read(queue, offset, max_messages, MAX_PULL_BYTES)
            if result.status is not GetStatus.FOUND:
                if scanned and result.status is GetStatus.NO_NEW_MESSAGE:  # (past what was skipped)
                    return GetResult(GetStatus.NO_NEW_MESSAGE, [], offset, result.min_offset, result.max_offset)
                return result
            matching = [m for m in result.messages if sql.matches(shown_properties(m, topic))]
            scanned += result.next_offset - offset
            scanned_bytes += sum(m.size for m in result.messages)
            offset = result.next_offset
            if matching:
                return GetResult(GetStatus.FOUND, matching, offset, result.min_offset, result.max_offset)
            if scanned >= SQL_SCAN_MESSAGES or scanned_bytes >= SQL_SCAN_BYTES:
                return GetResult(GetStatus.NO_MATCHED_MESSAGE, [], offset, result.min_offset, result.max_offset)

    def pull_message(self, conn: RemotingConnection, request: RemotingCommand) -> Reply:
        """Answered at once when there is data (or no suspend asked); else a coroutine that
        holds the pull until the store's notify or its timeout."""
        header = PullMessageHeader.from_ext_fields(request.ext_fields)
        queue = self._readable(header.topic, header.queue_id)
        reads = self.access.read_filter(conn.principal, header.topic)  # None: every message may be read
        selector = self._selector(header)
        if header.sys_flag & FLAG_COMMIT_OFFSET and header.commit_offset is not None and header.commit_offset >= 0:
            self.store.commit_offset_now(CONSUMER_PREFIX + header.consumer_group, queue, header.commit_offset)
        max_messages = max(1, min(header.max_msg_nums or 32, MAX_PULL_MESSAGES))
        offset = header.queue_offset
        result = self._read(queue, header.topic, offset, max_messages, selector)
        if (result.status in (GetStatus.NO_NEW_MESSAGE, GetStatus.NO_SUCH_QUEUE)
                and header.sys_flag & FLAG_SUSPEND and header.suspend_timeout_millis):
            timeout = min(header.suspend_timeout_millis / 1000, self.long_poll_max_s)
            return self._held_pull(conn, request, header, queue, max_messages, selector, timeout, result, reads)
        return self._pull_response(conn, request, result, offset, header, reads)

    async def _held_pull(self, conn: RemotingConnection, request: RemotingCommand, header: PullMessageHeader, queue: str,
                         max_messages: int, selector: Selector, timeout: float, result: GetResult,
                         reads) -> RemotingCommand:
        offset = header.queue_offset
        wait_at = result.next_offset if result.status is GetStatus.NO_NEW_MESSAGE else offset
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while await self.holds.wait(queue, wait_at, deadline - loop.time()):
            result = self._read(queue, header.topic, wait_at, max_messages, selector)
            if result.status is not GetStatus.NO_NEW_MESSAGE or result.next_offset <= wait_at:
                break  # something to answer (or a wake with nothing new: shutdown)
            wait_at = result.next_offset  # what came did not match: wait on past it
            if deadline - loop.time() <= 0:
                break
        return self._pull_response(conn, request, result, offset, header, reads)

    def _pull_response(self, conn: RemotingConnection, request: RemotingCommand, result: GetResult, offset: int,
                       header: PullMessageHeader, reads=None) -> RemotingCommand:
        topic, queue_id = header.topic, header.queue_id
        status = result.status
        ext = {"suggestWhichBrokerId": "0", "minOffset": str(result.min_offset),
               "maxOffset": str(result.max_offset)}
        messages = result.messages if reads is None or status is not GetStatus.FOUND else \
            [m for m in result.messages if reads(m)]  # (the ACL skips the others, as MQTT's deliveries)
        if status is GetStatus.FOUND and messages:
            self.stats.messages_sent += len(messages)
            if conn.tracer is not None:  # (a pull consumer acknowledges by offset: no ack events)
                client = f"{header.consumer_group}@{conn.client_id or conn.peer}"
                for m in messages:
                    conn.tracer.delivered("remoting", client, m.position, m.queue, m.queue_offset, 1)
            body = b"".join(encode_message(to_wire(m, topic, queue_id, self.origin)) for m in messages)
            ext["nextBeginOffset"] = str(result.next_offset)
            return response_to(request, ResponseCode.SUCCESS, ext_fields=ext, body=body)
        if status in (GetStatus.NO_MATCHED_MESSAGE, GetStatus.FOUND):
            ext["nextBeginOffset"] = str(result.next_offset)
            return response_to(request, ResponseCode.PULL_RETRY_IMMEDIATELY, "no matched message", ext_fields=ext)
        if status is GetStatus.NO_SUCH_QUEUE:
            ext.update(nextBeginOffset="0", minOffset="0", maxOffset="0")
            return response_to(request, ResponseCode.PULL_NOT_FOUND, "no message in queue", ext_fields=ext)
        if status is GetStatus.NO_NEW_MESSAGE:
            ext["nextBeginOffset"] = str(max(offset, result.next_offset))  # (past skipped messages)
            return response_to(request, ResponseCode.PULL_NOT_FOUND, "no new message", ext_fields=ext)
        # OFFSET_TOO_SMALL / OFFSET_OVERFLOW: the consumer is told where the queue is now
        ext["nextBeginOffset"] = str(result.next_offset)
        return response_to(request, ResponseCode.PULL_OFFSET_MOVED, f"offset {offset} is out of range",
                           ext_fields=ext)
