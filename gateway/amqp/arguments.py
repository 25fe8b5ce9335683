"""The one table of RabbitMQ's optional arguments (queue.declare, basic.consume,
exchange.declare, bindings to headers exchanges): for each argument RabbitMQ gives a meaning, the
values it accepts, and of those the ones not built here, refused with 406 PRECONDITION_FAILED
naming the argument rather than accepted and ignored. The other accepted values are built, or a
no-op whose behaviour is already RabbitMQ's (``lazy`` storage: messages are on disk anyway).
Arguments RabbitMQ does not know are ignored, as RabbitMQ ignores them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_EXPIRY_MS = 4_294_967_295  # RabbitMQ's longest TTL or expiration (its timers' limit)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _at_least(low: int) -> Callable[[Any], bool]:
    return lambda value: _integer(value) and low <= value


def _ttl(value: Any) -> bool:
    return _integer(value) and 0 <= value <= MAX_EXPIRY_MS


def _one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda value: type(value) is type(values[0]) and value in values


def _text(value: Any) -> bool:
    return isinstance(value, (str, bytes))


def _any(value: Any) -> bool:
    return True


def _never(value: Any) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class Argument:
    """What is done with one argument: ``valid`` says which values RabbitMQ accepts (others are
    invalid: 406); of those, ``refused`` says which are not built here (406 saying ``why``)."""

    valid: Callable[[Any], bool]
    refused: Callable[[Any], bool] = _never
    why: str = ""


def _not_built(why: str) -> Argument:
    return Argument(_any, _any, why)


_STREAMS = "streams are not built"
_QUORUM = "quorum queues are not built"

QUEUE_ARGUMENTS: Mapping[str, Argument] = {
    # built
    "x-message-ttl": Argument(_ttl),
    "x-expires": Argument(lambda v: _integer(v) and 1 <= v <= MAX_EXPIRY_MS),
    "x-max-length": Argument(_at_least(0)),
    "x-overflow": Argument(_one_of("drop-head", "reject-publish", "reject-publish-dlx"),
                           lambda v: v == "reject-publish-dlx", "reject-publish-dlx is not built (reject-publish is)"),
    "x-dead-letter-exchange": Argument(_text),
    "x-dead-letter-routing-key": Argument(_text),
    "x-delivery-limit": Argument(_at_least(0)),  # as a quorum queue's, on every queue
    # classic is what every queue here is; the others are refused
    "x-queue-type": Argument(_one_of("classic", "quorum", "stream"), lambda v: v != "classic",
                             "only classic queues are built (quorum and stream are not)"),
    # no-ops: RabbitMQ's behaviour already (one node; messages are on disk, as "lazy" asks)
    "x-queue-mode": Argument(_one_of("default", "lazy")),
    "x-queue-version": Argument(_one_of(1, 2)),
    "x-queue-master-locator": Argument(_text),
    "x-queue-leader-locator": Argument(_one_of("client-local", "balanced")),
    "x-dead-letter-strategy": Argument(_one_of("at-most-once", "at-least-once"), lambda v: v == "at-least-once",
                                       "at-least-once dead-lettering is not built (at-most-once is)"),
    "x-single-active-consumer": Argument(_one_of(True, False), lambda v: v is True,
                                         "single active consumer is not built"),
    # not built
    "x-max-priority": _not_built("priority queues are not built"),
    "x-max-length-bytes": _not_built("a length limit in bytes is not built (x-max-length is)"),
    "x-consumer-timeout": _not_built("a per-queue consumer timeout is not built"),
    "x-max-in-memory-length": _not_built(_QUORUM),
    "x-max-in-memory-bytes": _not_built(_QUORUM),
    "x-quorum-initial-group-size": _not_built(_QUORUM),
    "x-quorum-target-group-size": _not_built(_QUORUM),
    "x-max-age": _not_built(_STREAMS),
    "x-stream-max-segment-size-bytes": _not_built(_STREAMS),
    "x-stream-filter-size-bytes": _not_built(_STREAMS),
    "x-initial-cluster-size": _not_built(_STREAMS),
}

CONSUMER_ARGUMENTS: Mapping[str, Argument] = {
    "x-priority": Argument(_integer),  # built: higher first, the next while they are full
    "x-cancel-on-ha-failover": Argument(_one_of(True, False)),  # a no-op: no mirrors to fail over
    "x-stream-offset": _not_built(_STREAMS),
    "x-stream-filter": _not_built(_STREAMS),
    "x-stream-match-unfiltered": _not_built(_STREAMS),
    "x-credit": _not_built(_STREAMS),
}

BINDING_ARGUMENTS: Mapping[str, Argument] = {  # (of bindings to headers exchanges)
    "x-match": Argument(_one_of("all", "any", "all-with-x", "any-with-x")),
}

EXCHANGE_ARGUMENTS: Mapping[str, Argument] = {
    "alternate-exchange": _not_built("alternate exchanges are not built"),
}


def argument_problem(table: Mapping[str, Argument], kind: str, arguments: Mapping[str, Any]) -> str | None:
    """Why these arguments are refused (the text of a 406 PRECONDITION_FAILED), or None."""
    for name, value in arguments.items():
        rule = table.get(name)
        if rule is None:
            continue  # not RabbitMQ's: ignored, as RabbitMQ does
        if not rule.valid(value):
            return f"invalid arg '{name}' for {kind}: {value!r}"
        if rule.refused(value):
            return f"arg '{name}' is not supported: {rule.why}"
    return None
