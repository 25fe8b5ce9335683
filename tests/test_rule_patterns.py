"""Event patterns (bridge/rules/patterns.py, pattern_set.py) against a plain reference evaluator
written here from docs/rules.md, operator by operator and by hypothesis; bad patterns refused
with the JSON path and the reason; and the CloudEvent view (bridge/rules/events.py) of messages
published by real MQTT and AMQP clients through a running gateway, read back from its store."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import ipaddress
import json
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from bridge.rules import NO_DATA, PatternError, PatternSet, cloud_event, compile_pattern
from bridge.rules import events as rule_events
from protocols.mqtt.packets import MQTT_5

from .mqtt_support import PahoClient, mqtt_port, running_gateway

# -- the reference evaluator: the semantics of docs/rules.md, as plainly as they can be said ------
_ABSENT = object()


def _flat(value: Any) -> list[Any]:
    """A field's leaf values: none when absent or an object; a list's scalars, nested lists too."""
    if value is _ABSENT or isinstance(value, dict):
        return []
    if isinstance(value, list):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


def _objects(value: Any) -> list[dict]:
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list):
        return [o for item in value for o in _objects(item)]
    return []


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _same(a: Any, b: Any) -> bool:
    if a is None or isinstance(a, bool) or b is None or isinstance(b, bool):
        return a is b
    if _is_num(a) and _is_num(b):
        return a == b
    return isinstance(a, str) and isinstance(b, str) and a == b


def _glob(pattern: str, text: str) -> bool:
    tokens: list[str | None] = []  # None: a star
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            tokens.append(pattern[i + 1])
            i += 2
        else:
            tokens.append(None if pattern[i] == "*" else pattern[i])
            i += 1

    def at(t: int, s: int) -> bool:
        if t == len(tokens):
            return s == len(text)
        if tokens[t] is None:
            return any(at(t + 1, k) for k in range(s, len(text) + 1))
        return s < len(text) and text[s] == tokens[t] and at(t + 1, s + 1)
    return at(0, 0)


def _string_op(op: str, arg: Any, x: Any) -> bool:
    if not isinstance(x, str):
        return False
    if op == "prefix":
        return (x.casefold().startswith(arg["equals-ignore-case"].casefold()) if isinstance(arg, dict)
                else x.startswith(arg))
    if op == "suffix":
        return (x.casefold().endswith(arg["equals-ignore-case"].casefold()) if isinstance(arg, dict)
                else x.endswith(arg))
    if op == "equals-ignore-case":
        return any(x.casefold() == a.casefold() for a in (arg if isinstance(arg, list) else [arg]))
    if op == "wildcard":
        return any(_glob(a, x) for a in (arg if isinstance(arg, list) else [arg]))
    raise AssertionError(op)


def _compare(x: Any, op: str, n: Any) -> bool:
    return {"=": x == n, "!=": x != n, "<": x < n, "<=": x <= n, ">": x > n, ">=": x >= n}[op]


def _leaf(matcher: Any, x: Any) -> bool:
    if not isinstance(matcher, dict):
        return _same(matcher, x)
    ((op, arg),) = matcher.items()
    if op == "contains":
        return isinstance(x, str) and arg in x
    if op in ("prefix", "suffix", "equals-ignore-case", "wildcard"):
        return _string_op(op, arg, x)
    if op == "numeric":
        return _is_num(x) and all(_compare(x, arg[i], arg[i + 1]) for i in range(0, len(arg), 2))
    if op == "cidr":
        try:
            return isinstance(x, str) and ipaddress.ip_address(x) in ipaddress.ip_network(arg)
        except ValueError:
            return False
    if op == "anything-but":
        if isinstance(arg, dict):
            ((inner, text),) = arg.items()
            return isinstance(x, str) and not _string_op(inner, text, x)
        return not any(_same(v, x) for v in (arg if isinstance(arg, list) else [arg]))
    raise AssertionError(op)


def _field(matchers: list[Any], value: Any) -> bool:
    leaves = _flat(value)
    for m in matchers:
        if isinstance(m, dict) and "exists" in m:
            if m["exists"] == bool(leaves):
                return True
        elif any(_leaf(m, x) for x in leaves):
            return True
    return False


def _object(pattern: dict, obj: dict) -> bool:
    for key, sub in pattern.items():
        if key == "$or":
            if not any(_object(alternative, obj) for alternative in sub):
                return False
        elif isinstance(sub, dict):
            value = obj.get(key, _ABSENT)
            objects = _objects(value)
            if not (any(_object(sub, o) for o in objects) if objects else _object(sub, {})):
                return False
        elif not _field(sub, obj.get(key, _ABSENT)):
            return False
    return True


def reference(pattern: dict, event: Any) -> bool:
    return _object(pattern, event if isinstance(event, dict) else {})


# -- strategies: events and patterns over small alphabets, so that they often meet ---------------
KEYS = ["a", "b", "c"]
TEXTS = ["", "a", "ab", "AB", "ba", "bab", "ß", "SS", "x*y", "10.0.0.7", "10.0.1.7", "192.168.1.1", "::1",
         "2001:db8::5", "300"]
NUMBERS = [-1, 0, 0.5, 1, 1.0, 2, 3, 10, 300, 1e300, 2**70]
scalars = st.one_of(st.sampled_from(TEXTS), st.sampled_from(NUMBERS), st.booleans(), st.none())
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)),
                      max_leaves=8)
events = st.dictionaries(st.sampled_from(KEYS), values, max_size=3)

texts = st.sampled_from(TEXTS)
wildcards = st.sampled_from(["*", "a*", "*b", "a*b", "x\\*y", "*.*", "1*7", "*:*"])
numeric = st.one_of(
    st.tuples(st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), st.sampled_from(NUMBERS)).map(list),
    st.tuples(st.sampled_from([">", ">="]), st.sampled_from(NUMBERS), st.sampled_from(["<", "<="]),
              st.sampled_from(NUMBERS)).filter(lambda r: r[1] < r[3]).map(list))
operators = st.one_of(
    scalars,
    st.builds(lambda t: {"prefix": t}, texts),
    st.builds(lambda t: {"prefix": {"equals-ignore-case": t}}, texts),
    st.builds(lambda t: {"suffix": t}, texts),
    st.builds(lambda t: {"suffix": {"equals-ignore-case": t}}, texts),
    st.builds(lambda t: {"equals-ignore-case": t}, texts),
    st.builds(lambda t: {"contains": t}, texts),
    st.builds(lambda w: {"wildcard": w}, wildcards),
    st.builds(lambda n: {"numeric": n}, numeric),
    st.builds(lambda b: {"exists": b}, st.booleans()),
    st.builds(lambda c: {"cidr": c}, st.sampled_from(["10.0.0.0/24", "10.0.0.0/8", "192.168.0.0/16", "::/0",
                                                      "2001:db8::/32", "10.0.0.7/32"])),
    st.builds(lambda v: {"anything-but": v}, st.one_of(
        texts, st.sampled_from(NUMBERS), st.lists(st.one_of(texts, st.sampled_from(NUMBERS)), min_size=1, max_size=3),
        st.builds(lambda t: {"prefix": t}, texts), st.builds(lambda t: {"suffix": t}, texts),
        st.builds(lambda t: {"equals-ignore-case": t}, texts), st.builds(lambda w: {"wildcard": w}, wildcards))),
)
matcher_lists = st.lists(operators, min_size=1, max_size=3)


def _patterns(depth: int) -> st.SearchStrategy[dict]:
    field = matcher_lists if depth == 0 else st.one_of(matcher_lists, matcher_lists, _patterns(depth - 1))
    plain = st.dictionaries(st.sampled_from(KEYS), field, min_size=1, max_size=3)
    if depth == 0:
        return plain
    alternatives = st.lists(_patterns(depth - 1), min_size=2, max_size=3)
    return st.one_of(plain, st.builds(lambda p, alts: {**p, "$or": alts}, plain, alternatives))


patterns = _patterns(2)


@settings(max_examples=600, deadline=None)
@given(patterns, st.lists(events, min_size=1, max_size=5))
def test_a_compiled_pattern_agrees_with_the_reference(pattern: dict, sample: list[dict]) -> None:
    compiled = compile_pattern(json.dumps(pattern))
    for event in sample:
        assert compiled.matches(event) == reference(pattern, event), (pattern, event)


@settings(max_examples=300, deadline=None)
@given(st.lists(patterns, min_size=1, max_size=12), st.lists(events, min_size=1, max_size=8))
def test_a_pattern_set_names_what_the_reference_matches(rules: list[dict], sample: list[dict]) -> None:
    index = PatternSet({f"r{i}": rule for i, rule in enumerate(rules)})
    for event in sample:
        assert index.match(event) == [f"r{i}" for i, rule in enumerate(rules) if reference(rule, event)], event


# -- each operator, by example ------------------------------------------------------------------
EVENT = {
    "source": "/mqtt/clients/dev-7", "type": "tidemq.mqtt.message", "subject": "factory/line1/dev-7/telemetry",
    "properties": {"site": "Berlin", "fw": ["1.2.0", "1.3.0"]},
    "data": {"temp": 31.5, "count": 3, "state": "running", "empty": "", "nothing": None, "ok": True,
             "ip": "10.0.0.7", "ip6": "2001:db8::5", "file": "logs/lib/a.png",
             "readings": [{"kind": "t", "v": 20}, {"kind": "h", "v": 80}]},
}
CASES = [
    ({"type": ["tidemq.mqtt.message"]}, True),
    ({"type": ["other", "tidemq.mqtt.message"]}, True),
    ({"type": ["TIDEMQ.MQTT.MESSAGE"]}, False),
    ({"data": {"count": [3.0]}}, True),  # numbers by value
    ({"data": {"count": ["3"]}}, False),  # a string is no number
    ({"data": {"ok": [True]}}, True),
    ({"data": {"count": [True]}}, False),
    ({"data": {"nothing": [None]}}, True),
    ({"data": {"empty": [""]}}, True),
    ({"data": {"state": [{"prefix": "run"}]}}, True),
    ({"data": {"state": [{"prefix": {"equals-ignore-case": "RUN"}}]}}, True),
    ({"data": {"state": [{"suffix": "ing"}]}}, True),
    ({"data": {"state": [{"suffix": {"equals-ignore-case": "ING"}}]}}, True),
    ({"properties": {"site": [{"equals-ignore-case": "berlin"}]}}, True),
    ({"data": {"file": [{"contains": "/lib/"}]}}, True),
    ({"data": {"file": [{"contains": "/bin/"}]}}, False),
    ({"properties": {"fw": ["1.3.0"]}}, True),  # any value of a list
    ({"subject": [{"wildcard": "factory/*/telemetry"}]}, True),
    ({"subject": [{"wildcard": "factory/*/status"}]}, False),
    ({"data": {"file": [{"anything-but": {"wildcard": "*/lib/*"}}]}}, False),
    ({"data": {"state": [{"anything-but": "stopped"}]}}, True),
    ({"data": {"state": [{"anything-but": ["stopped", "running"]}]}}, False),
    ({"data": {"count": [{"anything-but": 3}]}}, False),
    ({"data": {"state": [{"anything-but": {"prefix": "run"}}]}}, False),
    ({"data": {"state": [{"anything-but": {"suffix": "x"}}]}}, True),
    ({"data": {"state": [{"anything-but": {"equals-ignore-case": ["RUNNING"]}}]}}, False),
    ({"data": {"missing": [{"anything-but": "x"}]}}, False),  # anything-but needs a value
    ({"data": {"temp": [{"numeric": [">", 30]}]}}, True),
    ({"data": {"temp": [{"numeric": [">", 30, "<=", 31.5]}]}}, True),
    ({"data": {"temp": [{"numeric": [">=", 0, "<", 31.5]}]}}, False),
    ({"data": {"count": [{"numeric": ["=", 3]}]}}, True),
    ({"data": {"count": [{"numeric": ["!=", 3]}]}}, False),
    ({"data": {"state": [{"numeric": [">", 0]}]}}, False),
    ({"data": {"temp": [{"exists": True}]}}, True),
    ({"data": {"missing": [{"exists": False}]}}, True),
    ({"data": {"readings": [{"exists": True}]}}, False),  # objects are no leaves
    ({"nowhere": {"deep": [{"exists": False}]}}, True),
    ({"data": {"ip": [{"cidr": "10.0.0.0/24"}]}}, True),
    ({"data": {"ip": [{"cidr": "10.0.1.0/24"}]}}, False),
    ({"data": {"ip6": [{"cidr": "2001:db8::/32"}]}}, True),
    ({"data": {"ip6": [{"cidr": "10.0.0.0/8"}]}}, False),
    ({"data": {"readings": {"kind": ["h"], "v": [80]}}}, True),
    ({"data": {"readings": {"kind": ["h"], "v": [20]}}}, False),  # the fields of one element
    ({"$or": [{"type": ["x"]}, {"data": {"count": [3]}}]}, True),
    ({"data": {"$or": [{"state": ["x"]}, {"temp": [1]}]}}, False),
    ({}, True),
]


@pytest.mark.parametrize(("pattern", "expected"), CASES, ids=[json.dumps(p) for p, _ in CASES])
def test_each_operator(pattern: dict, expected: bool) -> None:
    assert compile_pattern(json.dumps(pattern)).matches(EVENT) is expected
    assert reference(pattern, EVENT) is expected
    assert PatternSet({"one": pattern}).match(EVENT) == (["one"] if expected else [])


BAD = [
    ("[1]", "$", "a pattern is a JSON object, not a list"),
    ('{"a": ', "$", "not JSON"),
    ('{"a": [1], "a": [2]}', "$", "appears twice"),
    ('{"a": 1}', "$.a", "a list of matchers or an object"),
    ('{"a": []}', "$.a", "at least one matcher"),
    ('{"a": {}}', "$.a", "at least one field"),
    ('{"a": [[1]]}', "$.a[0]", "a value or an operator object"),
    ('{"a": [{"prefix": 1}]}', "$.a[0].prefix", "takes a string"),
    ('{"a": [{"contains": ["x"]}]}', "$.a[0].contains", "takes a string"),
    ('{"a": [{"prefix": "x", "suffix": "y"}]}', "$.a[0]", "exactly one operator"),
    ('{"a": [{"regex": "x"}]}', "$.a[0].regex", "unknown operator"),
    ('{"a": [{"numeric": [">", 5, "<", 2]}]}', "$.a[0].numeric[3]", "holds no number"),
    ('{"a": [{"numeric": ["~", 5]}]}', "$.a[0].numeric[0]", "unknown numeric operator"),
    ('{"a": [{"numeric": [">", "5"]}]}', "$.a[0].numeric[1]", "a number is expected"),
    ('{"a": [{"numeric": ["=", 5, "<", 9]}]}', "$.a[0].numeric[0]", "stand alone"),
    ('{"a": [{"numeric": [">", NaN]}]}', "$", "NaN is not a JSON number"),
    ('{"a": [{"exists": "yes"}]}', "$.a[0].exists", "true or false"),
    ('{"a": [{"cidr": "10.0.0.1/24"}]}', "$.a[0].cidr", "host bits set"),
    ('{"a": [{"cidr": "10.0.0.0/33"}]}', "$.a[0].cidr", "not an IPv4 or IPv6 CIDR block"),
    ('{"a": [{"wildcard": "a**b"}]}', "$.a[0].wildcard", "consecutive *"),
    ('{"a": [{"wildcard": "a\\\\qb"}]}', "$.a[0].wildcard", "escapes only"),
    ('{"a": [{"anything-but": true}]}', "$.a[0][\"anything-but\"]", "strings and numbers"),
    ('{"a": [{"anything-but": []}]}', "$.a[0][\"anything-but\"]", "non-empty list"),
    ('{"a": [{"anything-but": {"numeric": [">", 1]}}]}', "$.a[0][\"anything-but\"].numeric", "not \"numeric\""),
    ('{"a": {"b": [{"equals-ignore-case": []}]}}', "$.a.b[0][\"equals-ignore-case\"]", "non-empty list"),
    ('{"$or": [{"a": [1]}]}', '$["$or"]', "at least two patterns"),
    ('{"$or": [{"a": [1]}, 3]}', '$["$or"][1]', "non-empty object"),
    ('{"x y": [{"suffix": {"ignore": "a"}}]}', '$["x y"][0].suffix', "equals-ignore-case"),
]


@pytest.mark.parametrize(("text", "path", "reason"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_pattern_is_refused_with_its_path_and_reason(text: str, path: str, reason: str) -> None:
    with pytest.raises(PatternError) as caught:
        compile_pattern(text)
    assert caught.value.path == path
    assert reason in caught.value.reason
    assert str(caught.value).startswith(path + ": ")


def test_a_pattern_nested_too_deep_is_refused() -> None:
    pattern: dict = {"leaf": [1]}
    for _ in range(40):
        pattern = {"k": pattern}
    with pytest.raises(PatternError, match="nested deeper than"):
        compile_pattern(json.dumps(pattern))


def test_a_pattern_set_replaces_and_removes_by_name() -> None:
    rules = PatternSet({"hot": {"data": {"temp": [{"numeric": [">", 30]}]}}, "any": {}})
    assert rules.match(EVENT) == ["hot", "any"]
    rules.add("hot", {"data": {"temp": [{"numeric": [">", 40]}]}})
    assert rules.match(EVENT) == ["any"]
    rules.remove("any")
    assert rules.match(EVENT) == [] and len(rules) == 1
    with pytest.raises(PatternError):
        rules.add("bad", {"a": 1})
    assert "bad" not in rules


# -- the CloudEvent view --------------------------------------------------------------------------
def test_the_store_conventions_restated_for_rules_agree_with_the_gateways() -> None:
    from gateway import interop
    from gateway.amqp import messages as amqp_messages
    from gateway.mqtt import messages as mqtt_messages
    from gateway.remoting import messages as remoting_messages

    assert (rule_events.MQTT_FLAG, rule_events.MQTT_RETAIN_FLAG, rule_events.MQTT_PROPS_FLAG) == (
        interop.MQTT_FLAG, interop.RETAIN_FLAG, interop.PROPS_FLAG)
    assert (rule_events.AMQP_FLAG, rule_events.AMQP_PERSISTENT_FLAG) == (interop.AMQP_FLAG, interop.PERSISTENT_FLAG)
    assert rule_events.INTERNAL_PREFIXES == interop.INTERNAL_PREFIXES
    assert (rule_events.MQTT_CLIENT_ID, rule_events.MQTT_PROPS) == (mqtt_messages.CLIENT_ID, mqtt_messages.PROPS)
    assert (rule_events.AMQP_EXCHANGE, rule_events.AMQP_ROUTING_KEY, rule_events.AMQP_HEADER) == (
        amqp_messages.EXCHANGE, amqp_messages.ROUTING_KEY, amqp_messages.HEADER)
    assert rule_events.AMQP_HEADER_FIXED == amqp_messages.CONTENT_HEADER_FIXED
    assert (rule_events.REMOTING_FLAG, rule_events.REMOTING_BORN_HOST) == (
        remoting_messages.REMOTING_FLAG, remoting_messages.BORN_HOST_PROPERTY)


def _amqp_url(gw: Any) -> str:
    port = next(listener.address[1] for listener in gw.listeners if listener.protocol == "amqp")
    return f"amqp://guest:guest@127.0.0.1:{port}/"


async def test_an_mqtt_5_publish_as_a_cloud_event(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        device = PahoClient(mqtt_port(gw), "dev/7 a", version=MQTT_5)
        await device.connect()
        props = PahoProperties(PacketTypes.PUBLISH)
        props.UserProperty = [("site", "berlin"), ("fw", "1.2.0"), ("fw", "1.3.0")]
        await device.publish("factory/line1/dev-7/telemetry", json.dumps({"temp": 31.5, "ip": "10.0.0.7"}), 1,
                             properties=props)
        text = PahoProperties(PacketTypes.PUBLISH)
        text.ContentType = "text/plain"
        await device.publish("factory/line1/dev-7/log", b'{"looks": "like json"}', 1, retain=True, properties=text)
        await device.disconnect()
        (telemetry,) = gw.store.get_now("t:factory/line1/dev-7/telemetry", 0, 10).messages
        (log,) = gw.store.get_now("t:factory/line1/dev-7/log", 0, 10).messages

    event = cloud_event(telemetry)
    assert event.attributes() == {
        "specversion": "1.0", "id": telemetry.msg_id, "source": "/mqtt/clients/dev%2F7%20a",
        "type": "tidemq.mqtt.message", "time": event.time, "subject": "factory/line1/dev-7/telemetry",
        "datacontenttype": "application/json", "clientid": "dev/7 a", "qos": 1, "retain": False,
        "protocol": "mqtt", "topic": "factory/line1/dev-7/telemetry"}
    assert event.time.endswith("Z") and event.time.startswith("20")
    assert event.properties == {"site": "berlin", "fw": ["1.2.0", "1.3.0"]}
    assert event.data == {"temp": 31.5, "ip": "10.0.0.7"}
    view = event.for_matching()
    assert view["topiclevels"] == ["factory", "line1", "dev-7", "telemetry"]
    rules = PatternSet({
        "hot": {"protocol": ["mqtt"], "data": {"temp": [{"numeric": [">", 30]}]}},
        "berlin-fw13": {"properties": {"site": [{"equals-ignore-case": "BERLIN"}], "fw": ["1.3.0"]}},
        "line1": {"topiclevels": ["line1"], "data": {"ip": [{"cidr": "10.0.0.0/24"}]}},
        "line2": {"subject": [{"wildcard": "factory/line2/*"}]},
    })
    assert rules.match(view) == ["hot", "berlin-fw13", "line1"]

    declared_text = cloud_event(log)  # a declared type that is not JSON: attributes only
    assert declared_text.data is NO_DATA and declared_text.datacontenttype == "text/plain"
    assert "data" not in declared_text.for_matching()
    assert declared_text.extensions["retain"] is True
    assert compile_pattern({"data": {"looks": [{"exists": True}]}}).matches(declared_text.for_matching()) is False
    assert compile_pattern({"data": [{"exists": False}], "subject": [{"suffix": "/log"}]}).matches(
        declared_text.for_matching())


async def test_an_mqtt_3_publish_that_is_not_json_has_attributes_only(data_dir: Path) -> None:
    async with running_gateway(data_dir) as gw:
        device = PahoClient(mqtt_port(gw), "plain")
        await device.connect()
        await device.publish("plain/number", b"21.5", 0)
        await device.publish("plain/raw", b"\xff\x00binary", 1)  # (acknowledged once both are stored, in order)
        await device.disconnect()
        (raw,) = gw.store.get_now("t:plain/raw", 0, 10).messages
        (number,) = gw.store.get_now("t:plain/number", 0, 10).messages
    event = cloud_event(raw)
    assert event.data is NO_DATA and event.datacontenttype is None and event.properties == {}
    assert event.body == b"\xff\x00binary"
    assert "datacontenttype" not in event.attributes()
    assert cloud_event(number).data == 21.5 and cloud_event(number).extensions["qos"] == 0


async def test_an_amqp_publish_with_headers_as_a_cloud_event(data_dir: Path) -> None:
    async with running_gateway(data_dir, amqp_bind="127.0.0.1:0") as gw:
        connection = await aio_pika.connect(_amqp_url(gw))
        channel = await connection.channel()
        queue = await channel.declare_queue("orders", durable=True)
        await channel.default_exchange.publish(aio_pika.Message(
            json.dumps({"order": 17, "total": 99.5}).encode(), content_type="application/json; charset=utf-8",
            type="order.created", message_id="order-17", delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers={"region": "eu-west", "priority": 3, "tags": ["a", "b"], "price": decimal.Decimal("9.5"),
                     "at": dt.datetime(2026, 11, 29, 10, 0, tzinfo=dt.timezone.utc)}),
            routing_key="orders")
        await channel.default_exchange.publish(aio_pika.Message(b"not json at all"), routing_key="orders")
        stored: list = []
        for _ in range(50):  # (a publish without confirms is stored soon after)
            stored = gw.store.get_now("q:orders", 0, 10).messages
            if len(stored) == 2:
                break
            await asyncio.sleep(0.05)
        await queue.channel.close()
        await connection.close()
    first, second = stored
    event = cloud_event(first)
    assert (event.type, event.source, event.subject) == ("order.created", "/amqp/exchanges/amq.default", "orders")
    assert event.datacontenttype == "application/json; charset=utf-8"
    assert event.extensions == {"exchange": "", "routingkey": "orders", "persistent": True, "protocol": "amqp",
                                "topic": "orders", "msgkey": "order-17"}
    assert event.properties == {"region": "eu-west", "priority": 3, "tags": ["a", "b"], "price": 9.5,
                                "at": "2026-11-29T10:00:00Z"}
    assert event.data == {"order": 17, "total": 99.5}
    big_eu = {"type": [{"prefix": "order."}], "properties": {"region": [{"prefix": "eu-"}]},
              "data": {"total": [{"numeric": [">=", 50]}]}}
    assert PatternSet({"big-eu": big_eu}).match(event.for_matching()) == ["big-eu"]
    plain = cloud_event(second)
    assert plain.data is NO_DATA and plain.type == "tidemq.amqp.message" and plain.extensions["persistent"] is False
    assert PatternSet({"big-eu": big_eu}).match(plain.for_matching()) == []
