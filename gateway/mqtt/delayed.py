"""Delayed publish, as EMQX has it: a PUBLISH to ``$delayed/{seconds}/{topic}`` is stored at once
(acknowledged once durable) and delivered to ``topic``'s subscribers ``seconds`` later, through
the gateway's one timer (core/timer.py, store/holds/held_messages.py), so it survives a restart like any stored
message. The delay is a whole number of seconds up to 4,294,967 (EMQX's limit: 2**32 ms);
``topic`` must be a topic name a client may publish to (no wildcards, not ``$``-prefixed)."""

from __future__ import annotations

from protocols.mqtt.topics import TopicError, validate_topic_name

PREFIX = "$delayed/"
MAX_DELAY_S = 4_294_967


class DelayedTopicError(ValueError):
    """Not a delayed publish this gateway can take; the message says why."""


def parse_delayed(topic: str) -> tuple[int, str]:
    """``$delayed/{seconds}/{topic}`` -> (seconds, topic)."""
    rest = topic[len(PREFIX):]
    seconds, sep, target = rest.partition("/")
    if not sep or not seconds.isascii() or not seconds.isdigit():
        raise DelayedTopicError(f"a delayed publish goes to $delayed/{{seconds}}/{{topic}}, not {topic!r}")
    delay = int(seconds)
    if delay > MAX_DELAY_S:
        raise DelayedTopicError(f"delay of {delay} s is above the limit of {MAX_DELAY_S} s")
    if target.startswith("$"):
        raise DelayedTopicError(f"a delayed publish cannot go to {target!r}")
    try:
        validate_topic_name(target)
    except TopicError as exc:
        raise DelayedTopicError(f"bad topic after the delay: {exc}") from None
    return delay, target
