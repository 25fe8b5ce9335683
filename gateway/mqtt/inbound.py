"""The inbound side of an MQTT connection (``Inbound``, a component it owns): a client's
PUBLISHes checked (alias, topic, Receive Maximum: the sans-IO ServerConnection; payload format,
ACL: here), put to the store in batches through the ingest path (core/ingest.py), and
acknowledged in order once stored; the QoS 2 exchange's PUBREL."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from protocols.mqtt.errors import ProtocolViolation
from protocols.mqtt.packets import MQTT_5, PubComp, Publish, PubRec, PubRel
from protocols.mqtt.reason_codes import ReasonCode
from store import StoreError, now_ms
from store import TIMER

from ..core.ingest import PutPipeline, Refused
from ..tasks import all_done
from .delayed import PREFIX as DELAYED_PREFIX
from .delayed import DelayedTopicError, parse_delayed
from .messages import StoreMessageFactory

if TYPE_CHECKING:
    from .connection import MQTTConnection

log = logging.getLogger("tidemq.mqtt")


class Inbound:
    """Made by the connection's first PUBLISH (or PUBREL), after its CONNECT was accepted: an
    idle client, or one that only subscribes, has none. No bound methods are kept (64 bytes
    each, per connection): the connection's are looked up."""

    __slots__ = ("_messages", "broker", "conn", "connection", "puts")

    def __init__(self, connection: MQTTConnection) -> None:
        self.connection = connection
        # fixed for the connection's life: kept here, off the per-message attribute chain
        self.broker = connection.broker
        self.conn = connection.conn  # the protocol state: version, aliases, Receive Maximum
        # the ingest path; it pauses the connection's reading while too many puts are on their way
        self.puts = PutPipeline(connection.broker.store, connection.read_pauses, listener="mqtt",
                                watcher=connection.tracer)
        # what this client publishes carries its client id (its CONNECT was accepted)
        self.puts.who = connection.client_id
        self._messages = StoreMessageFactory(connection.client_id)

    def receive(self, packet: Publish, batch: list) -> None:
        session = self.connection.session
        assert session is not None
        topic = self.conn.inbound_publish(packet, session.awaiting_release)
        if topic is None:
            assert packet.packet_id is not None  # (a QoS 2 PUBLISH has one)
            self.connection.send_packet(PubRec(packet.packet_id))  # a resent QoS 2 PUBLISH: stored once already
            return
        props = packet.properties
        self.broker.stats.messages_received += 1
        refuse = None
        if props.payload_format_indicator == 1:
            try:
                packet.payload.decode("utf-8")
            except UnicodeDecodeError:
                refuse = ReasonCode.PAYLOAD_FORMAT_INVALID
        target = topic
        if refuse is None and topic.startswith(DELAYED_PREFIX):
            try:
                _, target = parse_delayed(topic)
            except DelayedTopicError as exc:
                log.info("delayed publish refused client_id=%s topic=%s reason=%s", self.connection.client_id, json.dumps(topic), exc)
                refuse = ReasonCode.TOPIC_NAME_INVALID
            else:
                if packet.retain:  # (a retained message is set when stored; this one is not yet delivered)
                    refuse = ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR
        if refuse is None and (target.startswith("$") or not self.connection.allowed(target, write=True)):
            refuse = ReasonCode.NOT_AUTHORIZED
        if refuse is not None:
            # (ACL refusals are counted and logged, rate-limited, by gateway/auth/authorize.py)
            log.debug("publish refused client_id=%s topic=%s reason=0x%02X", self.connection.client_id, topic, refuse)
            if packet.qos == 0:
                if refuse == ReasonCode.PAYLOAD_FORMAT_INVALID and self.conn.version == MQTT_5:
                    raise ProtocolViolation("payload is not UTF-8", refuse)
                return
            # 3.1.1 has no negative acknowledgement: the publish is acknowledged and dropped
            self._ack(packet, refuse if self.conn.version == MQTT_5 else ReasonCode.SUCCESS)
            return
        batch.append((packet, topic))

    def submit(self, batch: list[tuple[Publish, str]]) -> None:
        broker = self.broker
        queues_for = broker.wildcards.queues_for
        make = self._messages.message
        items = [(make(p, topic), queues_for(topic)) if topic[0] != "$" else _delayed(make, p, topic, queues_for)
                 for p, topic in batch]
        try:
            # a publish the store cannot take is refused alone; the others read with it go on
            self.puts.submit(items, lambda fut, refused: self._stored(batch, fut, refused))
        except StoreError as exc:
            self._failed(batch, exc)
            return

    def _stored(self, batch: list[tuple[Publish, str]], fut: asyncio.Future, refused: Refused) -> None:
        """Acknowledge in the order the publishes came (MQTT 4.6), each refused one where it was."""
        not_retained: set[int] = set()  # stored, but their retain flag could not be recorded
        if any(p.retain for p, _ in batch):
            kept = [i for i in range(len(batch)) if i not in refused]
            settling: list[Awaitable[None]] = []
            failed = self.broker.record_retained(
                [(batch[i][1], bool(batch[i][0].payload)) if batch[i][0].retain else None for i in kept], fut, settling)
            if failed is not None:
                not_retained = {i for i in kept[failed[0]:] if batch[i][0].retain}
            if settling:  # (the acknowledgements below wait: session_saves.py's write-ahead rule)
                self.broker.saves.hold_output(self.connection.client_id, all_done(settling))
        if fut.cancelled() or fut.exception() is not None:
            self._failed(batch, fut.exception() if not fut.cancelled() else None)
            return
        if self.connection.closed:
            return
        for i, (packet, topic) in enumerate(batch):
            if i in refused:
                self._refused(packet, topic, refused[i])
                if self.connection.closed:
                    return
            elif i in not_retained:
                if not packet.qos:
                    continue
                # 5.0: a negative acknowledgement; 3.1.1 has none, so it closes and the client resends
                if self.conn.version != MQTT_5:
                    self.connection.close()
                    return
                self._ack(packet, ReasonCode.UNSPECIFIED_ERROR)
            elif packet.qos:
                self._ack(packet, ReasonCode.SUCCESS)
        self.connection.flush()

    def _failed(self, batch: list[tuple[Publish, str]], exc: BaseException | None) -> None:
        self.broker.limited_log.log(logging.ERROR, type(exc).__name__, "publish not stored client_id=%s count=%d error=%s",
                                    self.connection.client_id, len(batch), json.dumps(str(exc)))
        if self.connection.closed:
            return
        if self.conn.version != MQTT_5:  # no negative acknowledgement in 3.1.1: the client resends
            self.connection.close()
            return
        for packet, _ in batch:
            if packet.qos:
                self._ack(packet, ReasonCode.UNSPECIFIED_ERROR)
        self.connection.flush()

    def _refused(self, packet: Publish, topic: str, exc: StoreError) -> None:
        """A publish the store refused alone (too large once stored with its queue list, or
        invalid): 5.0 answers it with a negative acknowledgement (a QoS 0 one has none:
        DISCONNECT 0x95); 3.1.1 has no negative acknowledgement, so the connection closes."""
        self.broker.limited_log.log(logging.WARNING, type(exc).__name__,
                                    "publish refused by the store client_id=%s topic=%s error=%s",
                                    self.connection.client_id, json.dumps(topic), json.dumps(str(exc)))
        if self.conn.version != MQTT_5:
            self.connection.close()
        elif not packet.qos:
            self.connection.disconnect(ReasonCode.PACKET_TOO_LARGE, str(exc))
        else:
            self._ack(packet, ReasonCode.IMPLEMENTATION_SPECIFIC_ERROR)

    def _ack(self, packet: Publish, code: ReasonCode) -> None:
        session = self.connection.session
        assert packet.packet_id is not None and session is not None
        awaiting = session.awaiting() if packet.qos == 2 else session.awaiting_release
        self.connection.send(self.conn.ack_publish(packet.qos, packet.packet_id, code, awaiting))
        if packet.qos == 2 and code < 0x80:
            self.broker.mark_dirty(session)

    def on_pubrel(self, packet: PubRel) -> None:
        session = self.connection.session
        assert session is not None
        code = self.conn.release(packet.packet_id, session.awaiting_release)
        if code == ReasonCode.SUCCESS:
            self.broker.mark_dirty(session)
        self.connection.send_packet(PubComp(packet.packet_id, code))


def _delayed(make, packet: Publish, topic: str, queues_for) -> tuple:
    """A ``$delayed/`` publish (checked by ``receive``): stored now for its topic, held until its time."""
    delay, target = parse_delayed(topic)
    message = make(packet, target)
    message.hold_kind, message.hold_due_ms = TIMER, now_ms() + delay * 1000
    return message, queues_for(target)
