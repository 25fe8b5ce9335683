"""Exchanges, bindings and queue definitions, and routing (which queues a publish reaches).

Each AMQP queue is the store queue ``q:{name}``; a publish is one commitlog append indexed into
every queue its exchange routes to. Definitions of durable exchanges, queues and bindings are
kept in the store's ``amqp.meta`` table as JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .arguments import BINDING_ARGUMENTS, EXCHANGE_ARGUMENTS, QUEUE_ARGUMENTS, argument_problem

ROUTING_TYPES = ("direct", "fanout", "topic", "headers")
# RabbitMQ's delayed-message plugin: routes as its "x-delayed-type" argument says, and holds a
# publish with an "x-delay" header (ms) in the store until then (the gateway's one timer); the
# queues are those bound when it is published (the plugin's: when it is delivered)
DELAYED = "x-delayed-message"
EXCHANGE_TYPES = (*ROUTING_TYPES, DELAYED)
BUILTIN_EXCHANGES = {
    "": "direct", "amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic",
    "amq.headers": "headers", "amq.match": "headers",
}


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic-exchange matching: words split on '.', '*' is one word, '#' zero or more.
    (MQTT's rules differ -- '#' only at the end, '$' topics -- so this is not protocols.mqtt.topics.)"""
    return _match(pattern.split("."), 0, key.split("."), 0)


def _match(p: list[str], i: int, k: list[str], j: int) -> bool:
    while i < len(p):
        word = p[i]
        if word == "#":
            if i == len(p) - 1:
                return True
            return any(_match(p, i + 1, k, jj) for jj in range(j, len(k) + 1))
        if j >= len(k) or (word != "*" and word != k[j]):
            return False
        i += 1
        j += 1
    return j == len(k)


def headers_match(arguments: dict[str, Any], headers: dict[str, Any] | None) -> bool:
    """Headers exchange: x-match all (default) or any over the binding's other arguments; with
    all-with-x / any-with-x, its x- arguments count too."""
    headers = headers or {}
    mode = arguments.get("x-match", "all")
    with_x = mode in ("all-with-x", "any-with-x")
    wanted = [(k, v) for k, v in arguments.items() if k != "x-match" and (with_x or not k.startswith("x-"))]
    if not wanted:
        return not mode.startswith("any")
    hits = [k in headers and (v is None or headers[k] == v) for k, v in wanted]
    return any(hits) if mode.startswith("any") else all(hits)


@dataclass(slots=True)
class Binding:
    queue: str
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def key(self, exchange: str) -> str:
        return "\x00".join((exchange, self.queue, self.routing_key, json.dumps(self.arguments, sort_keys=True,
                                                                                default=str)))


@dataclass(slots=True)
class Exchange:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)
    # exchange-to-exchange bindings (RabbitMQ's extension): ``Binding.queue`` names the
    # destination exchange
    exchange_bindings: list[Binding] = field(default_factory=list)

    def route(self, routing_key: str, headers: dict[str, Any] | None, mqtt: bool = False) -> set[str]:
        """Names of the bound queues this publish reaches (``mqtt``: a publish from MQTT topic
        space, where a ``$`` topic is matched by no key that starts with a wildcard, as no MQTT
        filter that does matches it: the ACL judges a binding by that filter)."""
        return self._matching(self.bindings, routing_key, headers, mqtt)

    def route_exchanges(self, routing_key: str, headers: dict[str, Any] | None, mqtt: bool = False) -> set[str]:
        """Names of the bound exchanges this publish goes on to."""
        return self._matching(self.exchange_bindings, routing_key, headers, mqtt) if self.exchange_bindings else set()

    @property
    def routing_type(self) -> str:
        """How it routes: its type, or a delayed exchange's "x-delayed-type"."""
        return self.type if self.type != DELAYED else str(self.arguments.get("x-delayed-type"))

    def delay_ms(self, headers: dict[str, Any] | None) -> int:
        """How long a publish waits before it is in its queues (an x-delayed-message exchange's
        "x-delay" header; none, not an integer, or not above 0: no wait, as the plugin)."""
        if self.type != DELAYED or not headers:
            return 0
        value = headers.get("x-delay")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    def _matching(self, bindings: list[Binding], routing_key: str, headers: dict[str, Any] | None,
                  mqtt: bool) -> set[str]:
        kind = self.routing_type
        if kind == "fanout":
            return {b.queue for b in bindings}
        if kind == "direct":
            return {b.queue for b in bindings if b.routing_key == routing_key}
        if kind == "topic":
            if mqtt and routing_key.startswith("$"):
                bindings = [b for b in bindings if b.routing_key.partition(".")[0] not in ("*", "#")]
            return {b.queue for b in bindings if topic_matches(b.routing_key, routing_key)}
        return {b.queue for b in bindings if headers_match(b.arguments, headers)}

    def settings(self) -> dict[str, Any]:
        """What exchange.declare sets, by RabbitMQ's names (a redeclaration must match it)."""
        return {"type": self.type, "durable": self.durable, "auto_delete": self.auto_delete,
                "internal": self.internal, "arguments": self.arguments}

    def definition(self) -> bytes:
        return json.dumps(self.settings(), default=str).encode()


def routed_queues(exchanges: dict[str, Exchange], name: str, routing_key: str,
                  headers: dict[str, Any] | None, mqtt: bool = False) -> set[str]:
    """Names of the queues a publish to exchange ``name`` reaches: its bindings', then on through
    exchange-to-exchange bindings, each exchange once (bindings may loop)."""
    exchange = exchanges.get(name)
    if exchange is None:
        return set()
    names = exchange.route(routing_key, headers, mqtt)
    if exchange.exchange_bindings:
        seen = {name}
        pending = list(exchange.route_exchanges(routing_key, headers, mqtt))
        while pending:
            onward_name = pending.pop()
            onward = exchanges.get(onward_name)
            if onward_name in seen or onward is None:
                continue
            seen.add(onward_name)
            names |= onward.route(routing_key, headers, mqtt)
            pending.extend(onward.route_exchanges(routing_key, headers, mqtt))
    return names


@dataclass(slots=True)
class QueueDefinition:
    name: str
    durable: bool = False
    exclusive: bool = False
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), default=str).encode()

    def settings(self) -> dict[str, Any]:
        """What queue.declare sets, for ``inequivalent`` (a redeclaration must match it; saying
        ``x-queue-type: classic`` or not is the same queue, as with RabbitMQ)."""
        arguments = self.arguments
        if arguments.get("x-queue-type") == "classic":
            arguments = {k: v for k, v in arguments.items() if k != "x-queue-type"}
        return {"durable": self.durable, "exclusive": self.exclusive, "auto_delete": self.auto_delete,
                "arguments": arguments}

    @classmethod
    def from_json(cls, raw: bytes) -> QueueDefinition:
        return cls(**json.loads(raw))

    # queue arguments, RabbitMQ's names and meanings
    @property
    def message_ttl_ms(self) -> int | None:
        value = self.arguments.get("x-message-ttl")
        return int(value) if value is not None else None

    @property
    def expires_ms(self) -> int | None:
        value = self.arguments.get("x-expires")
        return int(value) if value is not None else None

    @property
    def max_length(self) -> int | None:
        value = self.arguments.get("x-max-length")
        return int(value) if value is not None else None

    @property
    def overflow(self) -> str:
        return str(self.arguments.get("x-overflow", "drop-head"))

    @property
    def delivery_limit(self) -> int | None:
        """How often a message may be given back (nack/reject with requeue, its channel closed)
        before it is dead-lettered (reason ``delivery_limit``) instead, as a quorum queue's."""
        value = self.arguments.get("x-delivery-limit")
        return int(value) if value is not None else None

    @property
    def dead_letter_exchange(self) -> str | None:
        value = self.arguments.get("x-dead-letter-exchange")
        return str(value) if value is not None else None

    @property
    def dead_letter_routing_key(self) -> str | None:
        value = self.arguments.get("x-dead-letter-routing-key")
        return str(value) if value is not None else None


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "'true'" if value else "'false'"
    return f"'{value}'"


def inequivalent(kind: str, name: str, current: dict[str, Any], received: dict[str, Any]) -> str | None:
    """RabbitMQ's 406 text for a redeclaration that differs from what exists, naming the
    setting (or x-argument) and both values, or None when they agree."""
    for key in current:
        if key != "arguments" and current[key] != received.get(key):
            return (f"inequivalent arg '{key}' for {kind} '{name}' in vhost '/': received "
                    f"{_shown(received.get(key))} but current is {_shown(current[key])}")
    have, want = current.get("arguments") or {}, received.get("arguments") or {}
    for key in sorted(set(have) | set(want)):
        if have.get(key) != want.get(key):
            return (f"inequivalent arg '{key}' for {kind} '{name}' in vhost '/': received "
                    f"{_shown(want.get(key))} but current is {_shown(have.get(key))}")
    return None


def name_problem(kind: str, name: str) -> str | None:
    """A reason a new exchange or queue cannot have ``name`` (406 PRECONDITION_FAILED), or None:
    a NUL, which RabbitMQ takes, would make the store keys of one queue (its consumer offset,
    its delivery counts, its bindings) read as another's."""
    if "\x00" in name:
        shown = name.replace("\x00", "\\x00")
        return f"{kind} name '{shown}' has a NUL character, which TideMQ does not accept"
    return None


def check_exchange(exchange_type: str, arguments: dict[str, Any]) -> str | None:
    """A reason a new exchange cannot be declared so (406 PRECONDITION_FAILED), or None."""
    if exchange_type not in EXCHANGE_TYPES:
        return f"unknown exchange type '{exchange_type}'"
    problem = argument_problem(EXCHANGE_ARGUMENTS, "exchange", arguments)
    if problem:
        return problem
    if exchange_type == DELAYED and arguments.get("x-delayed-type") not in ROUTING_TYPES:
        return "Invalid argument, 'x-delayed-type' must be an existing exchange type"
    return None


def check_binding(exchange: Exchange, arguments: dict[str, Any]) -> str | None:
    """A reason a binding to ``exchange`` is refused (406 PRECONDITION_FAILED), or None: a
    headers exchange's x-match must be one RabbitMQ knows."""
    if exchange.routing_type != "headers":
        return None
    return argument_problem(BINDING_ARGUMENTS, "binding", arguments)


def check_queue_arguments(arguments: dict[str, Any]) -> str | None:
    """A reason the arguments are invalid or not built (406 PRECONDITION_FAILED), or None."""
    return argument_problem(QUEUE_ARGUMENTS, "queue", arguments)
