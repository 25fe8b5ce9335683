"""A client's SUBSCRIBE and UNSUBSCRIBE, for an MQTT connection (as Mosquitto's
handle_subscribe.c): each filter checked and authorized, its queue's cursor (or its shared
group) set up, retained messages sent; SUBACK / UNSUBACK."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from protocols.mqtt.errors import ProtocolViolation
from protocols.mqtt.packets import MQTT_5, RetainHandling, SubAck, Subscribe, UnsubAck, Unsubscribe
from protocols.mqtt.reason_codes import SUBACK_FAILURE_V3, ReasonCode
from protocols.mqtt.topics import TopicError, parse_shared
from store import StoredMessage

from ..core.cursor import Cursor
from ..interop import queue_for_filter
from .session import SubscriptionState

if TYPE_CHECKING:
    from .connection import MQTTConnection

log = logging.getLogger("tidemq.mqtt")


def subscribe(connection: MQTTConnection, packet: Subscribe) -> None:
    session = connection.session
    assert session is not None
    broker = connection.broker
    codes: list[int] = []
    identifier = packet.properties.subscription_identifiers[0] if packet.properties.subscription_identifiers else None
    retained_to_send: list[tuple[SubscriptionState, list[StoredMessage]]] = []
    failure = broker.saves.failure if session.persistent else None
    if failure is not None:  # its sessions cannot be stored now (a full disk): nothing is subscribed
        log.info("subscribe refused client_id=%s error=%s", connection.client_id, failure)
        code = ReasonCode.UNSPECIFIED_ERROR if connection.conn.version == MQTT_5 else SUBACK_FAILURE_V3
        connection.send_packet(SubAck(packet.packet_id, [code] * len(packet.subscriptions)))
        return
    for request in packet.subscriptions:
        # thousands of clients subscribe to the same filters: they share one copy of its text and
        # of its queue's name (a subscribed idle client keeps both), not one each
        request.topic_filter = sys.intern(request.topic_filter)
        try:
            group, topic_filter = parse_shared(request.topic_filter)
        except TopicError as exc:
            log.info("subscribe refused client_id=%s filter=%r error=%s", connection.client_id, request.topic_filter, exc)
            codes.append(ReasonCode.TOPIC_FILTER_INVALID if connection.conn.version == MQTT_5 else SUBACK_FAILURE_V3)
            continue
        if group is not None and request.no_local and connection.conn.version == MQTT_5:
            raise ProtocolViolation("No Local on a shared subscription")
        if group is not None and not broker.shared_refusal.available:
            broker.shared_refusal.refused("subscribe", connection.client_id, request.topic_filter)
            codes.append(ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED if connection.conn.version == MQTT_5
                         else SUBACK_FAILURE_V3)
            continue
        if not connection.allowed(topic_filter, write=False):
            codes.append(ReasonCode.NOT_AUTHORIZED if connection.conn.version == MQTT_5 else SUBACK_FAILURE_V3)
            continue
        key = request.topic_filter  # "$share/g/f" stays distinct from a plain "f"
        request.topic_filter = topic_filter = sys.intern(topic_filter)
        queue = sys.intern(queue_for_filter(topic_filter))
        existing = session.subscriptions.get(key)
        state = SubscriptionState(request, queue, group, identifier)
        session.add_subscription(key, state)
        if existing is None:
            broker.hold_filter(session, topic_filter)
            if group is not None:
                broker.join_share(key, connection)
            else:
                if queue not in session.cursors:
                    session.add_cursor(Cursor(queue, broker.store.max_offset_now(queue)))
                broker.add_reader(queue, connection.delivery.pusher)
        codes.append(request.qos)
        rh = request.retain_handling
        # retained messages are not sent for shared subscriptions (MQTT 5.0 section 4.8.2)
        if group is None and (rh == RetainHandling.SEND_ON_SUBSCRIBE
                              or (rh == RetainHandling.SEND_IF_NEW_SUBSCRIPTION and existing is None)):
            retained_to_send.append((state, broker.retained_matching(topic_filter)))
    connection.send_packet(SubAck(packet.packet_id, codes))
    for state, messages in retained_to_send:
        for message in messages:
            connection.delivery.send_retained(state, message)
    broker.mark_dirty(session)
    connection.delivery.pusher.schedule_pump()


def unsubscribe(connection: MQTTConnection, packet: Unsubscribe) -> None:
    session = connection.session
    assert session is not None
    codes: list[int] = []
    for topic_filter in packet.topic_filters:
        state = session.subscriptions.pop(topic_filter, None)
        if state is None:
            codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
            continue
        codes.append(ReasonCode.SUCCESS)
        connection.broker.release_filter(session, state.topic_filter)
        if state.share_group is not None:
            connection.broker.leave_share(topic_filter, connection, connection.delivery.take_shared_inflight(topic_filter))
            continue
        if state.queue not in session.queues_read():
            cursor = session.cursors.pop(state.queue, None)
            connection.broker.remove_reader(state.queue, connection.delivery.pusher)
            if cursor is not None:  # inflight messages of that queue finish, without a cursor
                cursor.unacked.clear()
    connection.send_packet(UnsubAck(packet.packet_id, codes if connection.conn.version == MQTT_5 else []))
    connection.broker.mark_dirty(session)
