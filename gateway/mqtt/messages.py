"""MQTT PUBLISH <-> store message: what travels with a stored message, and the outgoing
PUBLISH bytes, encoded once per variant and shared by every subscriber.

A message published over MQTT carries, in the store's per-message ``flag``:
``MQTT_FLAG`` (0x100) | QoS (bits 0-1) | ``RETAIN_FLAG`` (0x04) | ``PROPS_FLAG`` (0x08, it has
5.0 properties); and in its store properties ``mqtt.cid`` (the publisher's client id, for No
Local) and, with PROPS_FLAG, ``mqtt.props`` (the MQTT 5.0 property block of the PUBLISH,
base64, without Topic Alias and Subscription Identifiers). A message from another protocol has
no MQTT_FLAG: it is delivered at the subscription's QoS with no properties.
"""

from __future__ import annotations

import base64
import time
import weakref
from functools import partial

import cython

from protocols.mqtt.codec import PublishTemplate
from protocols.mqtt.packets import MQTT_5, Publish
from protocols.mqtt.properties import (
    EMPTY_PROPERTIES,
    Properties,
    decode_properties,
    encode_properties,
    encode_varint,
)
from store import Message, StoredMessage
from store import decode_properties as decode_store_properties
from store import encode_properties as encode_store_properties

from ..interop import MQTT_FLAG, PROPS_FLAG, RETAIN_FLAG

_V5 = cython.declare(cython.int, MQTT_5)
CLIENT_ID = "mqtt.cid"
PROPS = "mqtt.props"


KEY_PROPERTY = "key"


class StoreMessageFactory:
    """PUBLISH -> store Message for one publisher; the common case (no 5.0 properties) reuses
    the store-encoded property set instead of encoding it per message."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self._encoded = encode_store_properties({CLIENT_ID: client_id})

    def message(self, publish: Publish, topic: str) -> Message:
        flag = MQTT_FLAG | publish.qos | (RETAIN_FLAG if publish.retain else 0)
        p = publish.properties
        if p is not EMPTY_PROPERTIES:
            if p.topic_alias is not None or p.subscription_identifiers:
                p = p.copy(topic_alias=None, subscription_identifiers=[])
            block = encode_properties(p)
            if block:
                props = {CLIENT_ID: self.client_id, PROPS: base64.b64encode(block).decode()}
                # a 5.0 user property "key" is the message's key (tidemq ctl query --key)
                keys = [value for name, value in p.user_properties if name == KEY_PROPERTY]
                return Message(topic, publish.payload, props, key=" ".join(keys) or None, flag=flag | PROPS_FLAG)
        return Message(topic, publish.payload, encoded_properties=self._encoded, flag=flag)


@cython.cclass
class Delivery:
    """What a stored message means to MQTT subscribers, and its outgoing PUBLISH bytes per
    variant: made once per message object (``DeliveryMemo``) and shared by every subscriber.

    It keeps the message's body and raw properties, never the message: the memo holds its
    Deliveries for as long as their messages live, and a reference to the message would keep
    the message alive as long as the memo (a Delivery kept on the message itself, as it once
    was, made every message a reference cycle that outlived its last reader until a full
    collection: hundreds of MiB under load, issue 23.5)."""

    qos = cython.declare(cython.int, visibility="public")  # the QoS it was published with (2 for other protocols)
    retain = cython.declare(cython.bint, visibility="public")
    props = cython.declare(object, visibility="public")  # Properties | None
    expires_at = cython.declare(object, visibility="public")  # wall clock seconds, from Message Expiry Interval
    body = cython.declare(bytes, visibility="public")
    raw_properties = cython.declare(bytes, visibility="public")
    templates = cython.declare(dict, visibility="public")  # variant key -> PublishTemplate
    _publisher = cython.declare(object, visibility="public")
    # the variant asked for last, and its template (see ``template``)
    _last = cython.declare(object)
    _last_topic = cython.declare(object)
    _last_qos = cython.declare(cython.int)
    _last_retain = cython.declare(cython.bint)
    _last_version = cython.declare(cython.int)
    _last_props = cython.declare(object)

    def __init__(self, qos: int, retain: bool, props: Properties | None, expires_at: float | None, body: bytes,
                 raw_properties: bytes) -> None:
        self.qos = qos
        self.retain = retain
        self.props = props
        self.expires_at = expires_at
        self.body = body
        self.raw_properties = raw_properties
        self.templates = {}
        self._publisher = None
        self._last = None
        self._last_topic = self._last_props = None
        self._last_qos = self._last_version = -1
        self._last_retain = False

    def __repr__(self) -> str:
        return (f"Delivery(qos={self.qos}, retain={self.retain}, props={self.props!r}, expires_at={self.expires_at!r}, "
                f"body={self.body!r:.60})")

    @staticmethod
    @cython.locals(flag=cython.uint)
    def of(message: StoredMessage) -> Delivery:
        flag = message.flag
        if not flag & MQTT_FLAG:
            return Delivery(2, False, None, None, message.body, message.raw_properties)
        props = None
        expires_at = None
        if flag & PROPS_FLAG:
            raw = message.properties.get(PROPS)
            if raw:
                block = base64.b64decode(raw)
                props, _ = decode_properties(encode_varint(len(block)) + block, 0, "publish")
                if props.message_expiry_interval is not None:
                    expires_at = message.store_timestamp / 1000 + props.message_expiry_interval
        return Delivery(flag & 3, bool(flag & RETAIN_FLAG), props, expires_at, message.body, message.raw_properties)

    @property
    def publisher(self) -> str:
        """The publishing client id (read only for No Local subscriptions)."""
        if self._publisher is None:
            self._publisher = decode_store_properties(self.raw_properties).get(CLIENT_ID, "")
        return self._publisher

    def template(self, topic: str, qos: int, retain: bool, version: int, sub_ids: tuple[int, ...] = (),
                 remaining: int | None = None, alias: int | None = None) -> PublishTemplate:
        """The PUBLISH bytes of one variant: topic (or "" with a Topic Alias), QoS, retain,
        version and, in 5.0, the Subscription Identifiers, the Message Expiry Interval left
        (None: as published) and the Topic Alias that the copy carries."""
        props_key: tuple[object, ...]
        if version == _V5:
            props_key = (sub_ids, remaining, alias)
        else:
            props_key = ()  # below 5.0 a PUBLISH has no properties
        last = self._last
        # a fan-out asks for the same variant for each subscriber: the last one, without a key
        if last is not None and self._last_topic is topic and self._last_qos == qos \
                and self._last_retain == retain and self._last_version == version and self._last_props == props_key:
            return last
        key = (topic, qos, retain, version, props_key)
        found = self.templates.get(key)
        if found is None:
            props = None
            if version == _V5:
                base = self.props or Properties()
                props = base.copy(subscription_identifiers=list(sub_ids),
                                  message_expiry_interval=remaining if remaining is not None
                                  else base.message_expiry_interval, topic_alias=alias)
            found = self.templates[key] = PublishTemplate.of(topic, self.body, qos, retain, version, props)
        self._last, self._last_topic, self._last_qos, self._last_retain = found, topic, qos, retain
        self._last_version, self._last_props = version, props_key
        return found

    def remaining_expiry(self, now: float | None = None) -> int | None:
        """Seconds left (None: never expires; <= 0: expired, not to be delivered)."""
        if self.expires_at is None:
            return None
        return int(self.expires_at - (time.time() if now is None else now))


class DeliveryMemo:
    """Each message object's Delivery, decoded the first time a reader asks and kept while the
    object lives: the queue cache hands one object to every subscriber of a queue, so a message
    fanned out to a thousand subscribers is decoded once and each PUBLISH variant encoded once.

    Kept by the gateway, beside the store's records rather than in them, by object identity: a
    weak reference to the message drops its entry when the message is freed (the callback runs
    before the object's memory, and so its id, can be reused), so the memo holds nothing the
    cache and the readers no longer hold, and no reference cycle is made per message."""

    __slots__ = ("_entries", "_refs", "decoded")

    def __init__(self) -> None:
        # by id(message): the Delivery, and apart from it the weak reference that drops both (a
        # lookup, once per message and subscriber in a fan-out, touches the Delivery alone)
        self._entries: dict[int, Delivery] = {}
        self._refs: dict[int, weakref.ref[StoredMessage]] = {}
        self.decoded = 0  # Deliveries made (a message decoded), ever

    def __call__(self, message: StoredMessage) -> Delivery:
        key = id(message)
        found = self._entries.get(key)
        if found is not None:
            return found
        delivery = Delivery.of(message)
        self.decoded += 1
        self._entries[key] = delivery
        # on the message's death: _forget(key, ref), a C call (no closure per message)
        self._refs[key] = weakref.ref(message, partial(self._forget, key))
        return delivery

    def _forget(self, key: int, _ref: object) -> None:
        self._entries.pop(key, None)
        self._refs.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def live(self) -> list[Delivery]:
        """The Deliveries of the message objects alive now."""
        return list(self._entries.values())
