"""What an AMQP method needs (gateway/auth/authorize.py): RabbitMQ's configure / write / read
permissions on the exchanges and queues it names, as RabbitMQ's access-control table lists
them, and the MQTT topic rights of what crosses into or out of MQTT topic space through
``amq.topic``: a publish there (or to an exchange bound on into it) writes the topic of its
routing key; a binding from it -- or from an exchange it feeds -- and a consumer of a queue it
feeds read every topic of the binding keys on the way (all of them: a queue's messages cannot be
checked one by one, so a deny rule that touches a binding refuses it); an exchange bound into it,
or a queue dead-lettering into it (or into an exchange routing on into it), writes there.
Dead-lettering is a route as a binding is: a queue's dead letters reach its dead-letter
exchange, with the key they came with unless it sets one. Refusals raise 403 ACCESS_REFUSED (channel
close) worded as RabbitMQ's; a user without AMQP permissions may not open the vhost (530)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame

from protocols.amqp.frames import ACCESS_REFUSED, channel_error

from ..auth.authorize import Principal
from ..interop import binding_key_to_mqtt_filter, routing_key_to_mqtt_topic
from .broker import AMQPBroker
from .direct_reply import REPLY_QUEUE
from .login import login_name

if TYPE_CHECKING:
    from .channel import Channel
    from .connection import AMQPConnection


BRIDGE_EXCHANGE = "amq.topic"  # the exchange of MQTT topic space (docs/amqp.md: the MQTT bridge)


def principal(conn: AMQPConnection) -> Principal:
    return Principal("amqp", conn.username, None, conn.peer)


def _refused(who: Principal, resource: str) -> str:
    """RabbitMQ's text of a refusal (after "ACCESS_REFUSED - "), naming the login (an
    anonymous one as ``guest``, as RabbitMQ's)."""
    return f"access to {resource} in vhost '/' refused for user '{login_name(who.username)}'"


def vhost_refusal(conn: AMQPConnection) -> str | None:
    """Why connection.open is refused (None: allowed): as RabbitMQ, a user needs some AMQP
    permissions (an ``amqp`` line) on the vhost when an ACL is set."""
    authorizer = conn.broker.authorizer
    who = principal(conn)
    if not authorizer.enabled or authorizer.amqp_vhost_allowed(who):
        return None
    text = f"access to vhost '/' refused for user '{login_name(who.username)}'"
    return authorizer.denied(who, "amqp vhost", "/", text)


def check_method(channel: Channel, m: Frame) -> None:
    """Raise ACCESS_REFUSED when the connection's user may not do ``m`` (before it is done)."""
    authorizer = channel.broker.authorizer
    if not authorizer.enabled:
        return
    needs = _NEEDS.get(type(m))
    if needs is None or (isinstance(m, commands.Basic.Consume) and m.queue == REPLY_QUEUE):
        return  # (direct reply-to's pseudo-queue is every user's, as RabbitMQ's)
    who = principal(channel.connection)
    for permission, kind, name in needs(channel, m):
        if not authorizer.amqp_allows(who, permission, name):
            resource = f"{kind} '{name or 'amq.default'}'"
            text = authorizer.denied(who, f"amqp {permission}", resource, _refused(who, resource))
            raise channel_error(ACCESS_REFUSED, text, channel.number, m)
    topics = _TOPICS.get(type(m))
    refusal = topics(channel, who, m) if topics is not None else None
    if refusal is not None:
        raise channel_error(ACCESS_REFUSED, refusal, channel.number, m)


def publish_refusal(conn: AMQPConnection, exchange: str, routing_key: str) -> str | None:
    """Why this publish is refused (None: allowed): write on the exchange, and on the MQTT
    topic of its routing key when it goes to amq.topic."""
    authorizer = conn.broker.authorizer
    if not authorizer.enabled:
        return None
    who = principal(conn)
    if not authorizer.amqp_allows(who, "write", exchange):
        resource = f"exchange '{exchange or 'amq.default'}'"
        return authorizer.denied(who, "amqp write", resource, _refused(who, resource))
    if exchange == BRIDGE_EXCHANGE or _reaches_bridge(conn.broker, exchange, routing_key):
        # (also a key that is no MQTT topic name, "secret.+": it reaches the AMQP readers of
        # bindings that match it as it is, "secret.*" or "#", so its literal topic is checked)
        topic = routing_key_to_mqtt_topic(routing_key)
        if not authorizer.can_write(who, topic):
            # (RabbitMQ's topic authorisation words it so)
            return authorizer.denied(who, "publish", topic,
                                     _refused(who, f"topic '{routing_key}' in exchange '{exchange}'"))
    return None


# -- AMQP permissions per method -------------------------------------------------------------
def _queue(channel: Channel, name: str) -> str:
    return name or channel.connection.last_queue


def _exchange_declare(channel: Channel, m: commands.Exchange.Declare):
    if m.passive:
        return []
    needs = [("configure", "exchange", m.exchange)]
    alternate = (m.arguments or {}).get("alternate-exchange")
    if isinstance(alternate, str):  # (then refused as not built: model.py)
        needs += [("write", "exchange", alternate), ("read", "exchange", m.exchange)]
    return needs


def _queue_declare(channel: Channel, m: commands.Queue.Declare):
    if m.passive:
        return []
    # a server-named queue is named amq.gen-... (RabbitMQ checks the name it generates)
    name = m.queue or "amq.gen-"
    needs = [("configure", "queue", name)]
    dlx = (m.arguments or {}).get("x-dead-letter-exchange")
    if isinstance(dlx, str):  # its dead letters are written there, and read from the queue
        needs += [("write", "exchange", dlx), ("read", "queue", name)]
    return needs


_NEEDS = {
    commands.Exchange.Declare: _exchange_declare,
    commands.Exchange.Delete: lambda ch, m: [("configure", "exchange", m.exchange)],
    commands.Exchange.Bind: lambda ch, m: [("write", "exchange", m.destination), ("read", "exchange", m.source)],
    commands.Exchange.Unbind: lambda ch, m: [("write", "exchange", m.destination), ("read", "exchange", m.source)],
    commands.Queue.Declare: _queue_declare,
    commands.Queue.Delete: lambda ch, m: [("configure", "queue", _queue(ch, m.queue))],
    commands.Queue.Purge: lambda ch, m: [("read", "queue", _queue(ch, m.queue))],
    commands.Queue.Bind: lambda ch, m: [("write", "queue", _queue(ch, m.queue)), ("read", "exchange", m.exchange)],
    commands.Queue.Unbind: lambda ch, m: [("write", "queue", _queue(ch, m.queue)), ("read", "exchange", m.exchange)],
    commands.Basic.Consume: lambda ch, m: [("read", "queue", _queue(ch, m.queue))],
    commands.Basic.Get: lambda ch, m: [("read", "queue", _queue(ch, m.queue))],
}


# -- MQTT topic space through amq.topic ------------------------------------------------------
def _reaches_bridge(broker: AMQPBroker, exchange: str, routing_key: str | None = None) -> bool:
    """Whether messages published to ``exchange`` (with ``routing_key``, for the default
    exchange; None: any) can be routed on into amq.topic with the key they came with: through
    exchanges bound on, and queues that dead-letter them keeping their key (a dead-letter
    routing key was checked when its queue was declared)."""
    pending, seen = [exchange], {exchange}
    while pending:
        name = pending.pop()
        onward = []
        source = broker.exchanges.get(name)
        for binding in source.exchange_bindings if source is not None else ():
            onward.append(binding.queue)
        for queue in _queues_of(broker, name, routing_key if name == exchange else None):
            definition = queue.definition
            if definition.dead_letter_exchange is not None and definition.dead_letter_routing_key is None:
                onward.append(definition.dead_letter_exchange)
        for target in onward:
            if target == BRIDGE_EXCHANGE:
                return True
            if target not in seen:
                seen.add(target)
                pending.append(target)
    return False


def _queues_of(broker: AMQPBroker, exchange: str, routing_key: str | None) -> list:
    """The queues ``exchange`` may route to (the default exchange: the one ``routing_key``
    names; None: any)."""
    if exchange == "":
        if routing_key is None:
            return list(broker.queues.values())
        queue = broker.queues.get(routing_key)
        return [queue] if queue is not None else []
    source = broker.exchanges.get(exchange)
    return [broker.queues[b.queue] for b in source.bindings if b.queue in broker.queues] if source is not None else []


def _bridge_keys(broker: AMQPBroker, *, queue: str | None = None, exchange: str | None = None) -> list[str]:
    """The amq.topic binding keys whose messages reach this queue or exchange, directly, through
    exchanges bound from amq.topic, or as dead letters of queues they reach (a superset of what
    really gets there)."""
    keys: list[str] = []
    start = ("queue", queue) if queue is not None else ("exchange", exchange)
    pending: list[tuple[str, str | None]] = [start]
    seen = {start}

    def visit(node: tuple[str, str | None]) -> None:
        if node not in seen:
            seen.add(node)
            pending.append(node)

    while pending:
        kind, name = pending.pop()
        for source in broker.exchanges.values():
            bindings = source.bindings if kind == "queue" else source.exchange_bindings
            for binding in bindings:
                if binding.queue != name:
                    continue
                if source.name == BRIDGE_EXCHANGE:
                    keys.append(binding.routing_key)
                else:
                    visit(("exchange", source.name))
        for dead in broker.queues.values():  # queues that dead-letter here
            definition = dead.definition
            if kind == "exchange":
                feeds = definition.dead_letter_exchange == name
            else:  # (through the default exchange: by the dead-letter key, or the key they came with)
                feeds = definition.dead_letter_exchange == "" and definition.dead_letter_routing_key in (None, name)
            if feeds:
                visit(("queue", dead.name))
    return keys


def _unreadable_key(broker: AMQPBroker, who: Principal, keys: list[str]) -> str | None:
    for key in keys:
        topic_filter = binding_key_to_mqtt_filter(key)
        if topic_filter is not None and not broker.authorizer.can_read_all(who, topic_filter):
            return f"{BRIDGE_EXCHANGE} {key} (MQTT {topic_filter})"
    return None


def queue_topics_readable(broker: AMQPBroker, who: Principal, queue: str) -> bool:
    """Every MQTT topic amq.topic can bring into ``queue`` may be read (the data API's reads)."""
    return _unreadable_key(broker, who, _bridge_keys(broker, queue=queue)) is None


def _reads_keys(channel: Channel, who: Principal, keys: list[str], action: str) -> str | None:
    unreadable = _unreadable_key(channel.broker, who, keys)
    return None if unreadable is None else channel.broker.authorizer.denied(who, action, unreadable)


def _reads_topics(channel: Channel, who: Principal, source: str, binding_key: str) -> str | None:
    """A binding from ``source``: from amq.topic, its key's topics; from an exchange amq.topic
    feeds, the topics of the keys on the way there."""
    if source == BRIDGE_EXCHANGE:
        return _reads_keys(channel, who, [binding_key], "bind")
    return _reads_keys(channel, who, _bridge_keys(channel.broker, exchange=source), "bind")


def _consumes_topics(channel: Channel, who: Principal, queue: str) -> str | None:
    return _reads_keys(channel, who, _bridge_keys(channel.broker, queue=_queue(channel, queue)), "consume")


def _purges_topics(channel: Channel, who: Principal, queue: str) -> str | None:
    """A purge takes what the queue holds, as a read does (RabbitMQ: read on the queue)."""
    return _reads_keys(channel, who, _bridge_keys(channel.broker, queue=_queue(channel, queue)), "purge")


def _writes_topics(channel: Channel, who: Principal, routing: str | None) -> str | None:
    """Messages routed on into amq.topic with ``routing`` (a binding or routing key; None:
    any key) reach the AMQP readers of MQTT topics."""
    topic_filter = "#" if routing is None else binding_key_to_mqtt_filter(routing)
    authorizer = channel.broker.authorizer
    if topic_filter is not None and not authorizer.can_write_all(who, topic_filter):
        return authorizer.denied(who, "route", f"{BRIDGE_EXCHANGE} {routing if routing is not None else '#'}")
    return None


def _exchange_bind_topics(channel: Channel, who: Principal, m: commands.Exchange.Bind) -> str | None:
    refusal = _reads_topics(channel, who, m.source, m.routing_key)
    if refusal is None and m.destination == BRIDGE_EXCHANGE:
        source = channel.broker.exchanges.get(m.source)
        keyed = source is not None and source.routing_type in ("topic", "direct")
        refusal = _writes_topics(channel, who, m.routing_key if keyed else None)
    return refusal


def _queue_declare_topics(channel: Channel, who: Principal, m: commands.Queue.Declare) -> str | None:
    arguments = m.arguments or {}
    dlx = arguments.get("x-dead-letter-exchange")
    key = arguments.get("x-dead-letter-routing-key")
    key = key if isinstance(key, str) else None
    if m.passive or not isinstance(dlx, str):
        return None
    if dlx != BRIDGE_EXCHANGE and not _reaches_bridge(channel.broker, dlx, key):
        return None
    return _writes_topics(channel, who, key)


# (a method class -> the check of that class's methods: Any, as no type pairs key and value)
_TOPICS: dict[type[Frame], Callable[[Channel, Principal, Any], str | None]] = {
    commands.Queue.Bind: lambda ch, who, m: _reads_topics(ch, who, m.exchange, m.routing_key),
    commands.Basic.Consume: lambda ch, who, m: _consumes_topics(ch, who, m.queue),
    commands.Basic.Get: lambda ch, who, m: _consumes_topics(ch, who, m.queue),
    commands.Queue.Purge: lambda ch, who, m: _purges_topics(ch, who, m.queue),
    commands.Exchange.Bind: _exchange_bind_topics,
    commands.Queue.Declare: _queue_declare_topics,
}
