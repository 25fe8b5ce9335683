"""Hypothesis strategies for MQTT packets, shared by the codec tests and the differential tests
of the compiled codec (tests/test_native_mqtt.py)."""

from __future__ import annotations

from hypothesis import strategies as st

from protocols.mqtt import properties as P
from protocols.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from protocols.mqtt.properties import PROPERTY_TABLE, Properties

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
binary = st.binary(max_size=24)
packet_id = st.integers(1, 0xFFFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)


def properties_for(kind: str) -> st.SearchStrategy[Properties]:
    """Valid properties that packet ``kind`` may carry."""
    allowed = {name: wire for name, wire, kinds in PROPERTY_TABLE.values() if kind in kinds}
    parts: dict[str, st.SearchStrategy] = {}
    for name, wire in allowed.items():
        if name == "user_properties":
            parts[name] = st.lists(st.tuples(text, text), max_size=3)
        elif name == "subscription_identifiers":
            parts[name] = st.lists(st.integers(1, P.MAX_VARINT), max_size=1 if kind == P.SUBSCRIBE else 3)
        elif name in P._BOOLEAN_BYTES:
            parts[name] = st.none() | st.integers(0, 1)
        elif wire == P.BYTE:
            parts[name] = st.none() | st.integers(0, 255)
        elif wire in (P.U16, P.U32):
            low = 1 if name in P._NON_ZERO else 0
            parts[name] = st.none() | st.integers(low, 0xFFFF if wire == P.U16 else 0xFFFF_FFFF)
        elif wire == P.UTF8:
            parts[name] = st.none() | text
        else:
            parts[name] = st.none() | binary
    strategy = st.fixed_dictionaries(parts).map(lambda kw: Properties(**kw))
    if kind == P.CONNECT:  # authentication data needs a method
        strategy = strategy.filter(lambda p: p.authentication_data is None or p.authentication_method is not None)
    return strategy


def props(kind: str, version: int) -> st.SearchStrategy[Properties]:
    return properties_for(kind) if version == MQTT_5 else st.just(Properties())


def reason(version: int) -> st.SearchStrategy[int]:
    return st.integers(0, 255) if version == MQTT_5 else st.just(0)


def publishes(version: int) -> st.SearchStrategy[Publish]:
    return st.integers(0, 2).flatmap(lambda qos: st.builds(
        Publish, text, binary, st.just(qos), st.booleans(), st.booleans() if qos else st.just(False),
        packet_id if qos else st.none(), props(P.PUBLISH, version)))


def packets(version: int) -> st.SearchStrategy:
    will = st.builds(Will, text, binary, st.integers(0, 2), st.booleans(), props(P.WILL, version))
    connect_versions = st.sampled_from([MQTT_3_1, MQTT_3_1_1]) if version != MQTT_5 else st.just(MQTT_5)
    connect = st.builds(
        Connect, text, connect_versions, st.booleans(), u16, st.none() | text, st.none() | binary,
        st.none() | will, props(P.CONNECT, version),
    ).filter(lambda c: c.version == MQTT_5 or c.password is None or c.username is not None)
    v3_connack = st.sampled_from([0, 0x84, 0x85, 0x88, 0x86, 0x87])
    connack = st.builds(ConnAck, st.booleans(), v3_connack if version != MQTT_5 else st.integers(0, 255),
                        props(P.CONNACK, version))
    publish = publishes(version)
    acks = st.one_of(*(st.builds(cls, packet_id, reason(version), props(cls.__name__.lower(), version))
                       for cls in (PubAck, PubRec, PubRel, PubComp)))
    subscription = (
        st.builds(Subscription, text, st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 2))
        if version == MQTT_5 else st.builds(Subscription, text, st.integers(0, 2))
    )
    subscribe = st.builds(Subscribe, packet_id, st.lists(subscription, min_size=1, max_size=4),
                          props(P.SUBSCRIBE, version))
    suback = st.builds(SubAck, packet_id, st.lists(st.integers(0, 255), min_size=1, max_size=4),
                       props(P.SUBACK, version))
    unsubscribe = st.builds(Unsubscribe, packet_id, st.lists(text, min_size=1, max_size=4),
                            props(P.UNSUBSCRIBE, version))
    unsuback = st.builds(UnsubAck, packet_id,
                         st.lists(st.integers(0, 255), max_size=4) if version == MQTT_5 else st.just([]),
                         props(P.UNSUBACK, version))
    disconnect = st.builds(Disconnect, reason(version), props(P.DISCONNECT, version))
    choices = [connect, connack, publish, acks, subscribe, suback, unsubscribe, unsuback, disconnect,
               st.just(PingReq()), st.just(PingResp())]
    if version == MQTT_5:
        choices.append(st.builds(Auth, st.integers(0, 255), props(P.AUTH, version)))
    return st.one_of(*choices)
