"""Consumer clients and groups: heartbeats, unregistering, the group's member list (and telling
members when it changes, so they rebalance), its backlog, and queue locks for orderly
consumers. Mixed into ``RemotingBroker``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import json
import time

from protocols.remoting.codes import ResponseCode
from protocols.remoting.frames import RemotingCommand, response_to

from ..interop import remoting_queue
from .access import Right
from .broker_parts import BrokerParts
from .groups import Subscription
from .requests import CONSUMER_PREFIX, BadRequest, str_field
from .topics import retry_topic

if TYPE_CHECKING:
    from .connection import RemotingConnection


class ConsumerRequests(BrokerParts):
    def heartbeat(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        try:
            data = json.loads(request.body or b"{}")
        except ValueError as exc:
            raise BadRequest(f"the heartbeat body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadRequest("the heartbeat body is not a JSON object")
        client_id = str(data.get("clientID") or "")
        consumers = data.get("consumerDataSet") or []
        for consumer in consumers:  # (all checked before any is registered)
            for sub in consumer.get("subscriptionDataSet") or []:
                if sub.get("topic"):
                    self.access.check_topic(conn.principal, str(sub["topic"]), Right.READ, "subscribe")
        conn.client_id = client_id or conn.client_id
        for consumer in consumers:
            group = str(consumer.get("groupName") or "")
            if not group:
                continue
            subs = [Subscription(str(s.get("topic", "")), str(s.get("subString") or "*"),
                                 str(s.get("expressionType") or "TAG"), int(s.get("subVersion") or 0))
                    for s in consumer.get("subscriptionDataSet") or [] if s.get("topic")]
            model = str(consumer.get("messageModel") or "CLUSTERING")
            if model == "CLUSTERING":
                self.topics.ensure(retry_topic(group), 1)
            self.groups.heartbeat(group, client_id, conn, subs, model,
                                  str(consumer.get("consumeFromWhere") or "CONSUME_FROM_LAST_OFFSET"),
                                  principal=conn.principal)
        for producer in data.get("producerDataSet") or []:  # (transaction checks ask one of them)
            group = str(producer.get("groupName") or "")
            if group:
                self.producers.heartbeat(group, client_id, conn)
        # (Java clients read this map unchecked after a heartbeat; we do not do HeartbeatV2)
        return response_to(request, ResponseCode.SUCCESS, ext_fields={"IS_SUPPORT_HEART_BEAT_V2": "false"})

    def check_client_config(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG: a Java push consumer asks at start-up whether the broker can
        filter by its non-TAG subscription (MQClientInstance.checkClientInBroker); a bad
        expression fails the consumer's start with the parser's message."""
        try:
            data = json.loads(request.body or b"{}")
            sub = data.get("subscriptionData") or {}
            expression, kind = sub.get("subString"), sub.get("expressionType")
        except (ValueError, AttributeError) as exc:
            raise BadRequest(f"bad check client config body: {exc}") from None
        if sub:
            self.selectors.get(None if expression is None else str(expression), str(kind or "") or None)
        return response_to(request, ResponseCode.SUCCESS)

    def unregister_client(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        ext = request.ext_fields
        group = ext.get("consumerGroup")
        if group:
            self.groups.unregister(group, ext.get("clientID", ""))
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

    def get_consumer_list(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        group = str_field(request.ext_fields, "consumerGroup")
        ids = self.groups.client_ids(group)
        if not ids:
            return response_to(request, ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return response_to(request, ResponseCode.SUCCESS, body=json.dumps({"consumerIdList": ids}).encode())

    def group_lag(self, group: str) -> int:
        """Messages of the group's subscribed topics it has not consumed (committed) yet."""
        topics = {topic for member in self.groups.members(group) for topic in member.subscriptions}
        lag = 0
        for topic in topics:
            config = self.topics.get(topic)
            if config is None:
                continue
            for queue_id in range(config.read_queues):
                queue = remoting_queue(topic, queue_id)
                end = self.store.max_offset_now(queue)
                committed = self.store.get_offset_now(CONSUMER_PREFIX + group, queue)
                lag += max(0, end - (committed if committed is not None else self._min_offset(queue)))
        return lag

    def _members_changed(self, group: str, members) -> None:
        for member in members:
            member.connection.notify_consumer_ids_changed(group)

    def lock_batch(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand:
        try:
            data = json.loads(request.body or b"{}")
            group, client = str(data["consumerGroup"]), str(data["clientId"])
            wanted = [(str(mq["topic"]), int(mq["queueId"]), mq) for mq in data.get("mqSet") or []]
        except (ValueError, KeyError, TypeError) as exc:
            raise BadRequest(f"bad lock request body: {exc}") from None
        for topic in {topic for topic, _, _ in wanted}:
            self.access.check_topic(conn.principal, topic, Right.READ, "lock")
        now = time.monotonic()
        locked = []
        for topic, qid, mq in wanted:
            holder = self._locks.get((group, topic, qid))
            if holder is None or holder[0] == client or now - holder[1] > 60.0:
                self._locks[(group, topic, qid)] = (client, now)
                locked.append(mq)
        return response_to(request, ResponseCode.SUCCESS, body=json.dumps({"lockOKMQSet": locked}).encode())

    def unlock_batch(self, conn: RemotingConnection, request: RemotingCommand) -> RemotingCommand | None:
        try:
            data = json.loads(request.body or b"{}")
            group, client = str(data["consumerGroup"]), str(data["clientId"])
            keys = [(group, str(mq["topic"]), int(mq["queueId"])) for mq in data.get("mqSet") or []]
        except (ValueError, KeyError, TypeError) as exc:
            raise BadRequest(f"bad unlock request body: {exc}") from None
        for topic in {topic for _, topic, _ in keys}:
            self.access.check_topic(conn.principal, topic, Right.READ, "unlock")
        for key in keys:
            if self._locks.get(key, ("",))[0] == client:
                del self._locks[key]
        return None if request.is_oneway else response_to(request, ResponseCode.SUCCESS)

