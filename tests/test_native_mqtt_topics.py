"""Differential tests of the compiled MQTT topic rules (protocols/mqtt/topics.py): the C extension
and the interpreted reference give the same answers and the same errors for topic names and
filters built from the characters that matter, for any text, and for what is not text at all
(None, numbers, bytes, a ``str`` subclass: the edge where a compiled ``str`` argument would
refuse what the interpreted function takes)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from .native_support import compiled, interpreted

TOPICS = "protocols.mqtt.topics"
FUNCTIONS_OF_ONE = ["validate_topic_name", "validate_topic_filter", "is_wildcard", "parse_shared"]
FUNCTIONS_OF_TWO = ["matches", "covers", "overlaps"]


class Text(str):
    """A ``str`` subclass (a caller's own string type)."""


def outcome(call: Any, *args: Any) -> tuple[str, Any]:
    """A call's value, or its error: a TopicError's message (each build has its own class), or
    the type of any other error (a TypeError for what is not text: its wording is CPython's or
    Cython's)."""
    try:
        return "value", call(*args)
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        name = type(exc).__name__
        return "error", (name, str(exc) if name == "TopicError" else "")


levels = st.lists(st.sampled_from(["a", "b", "+", "#", "", "$SYS", "$share", "x+", "#y", "\x00", "é"]),
                  min_size=1, max_size=5).map("/".join)
anything = st.one_of(levels, levels.map(Text), st.text(max_size=20), st.none(), st.integers(), st.binary(max_size=5))


@settings(max_examples=400, deadline=None)
@given(text=anything, other=anything)
def test_the_topic_rules_give_the_same_answers_and_errors(text: Any, other: Any) -> None:
    fast, reference = compiled(TOPICS), interpreted(TOPICS)
    assert fast is not reference
    for name in FUNCTIONS_OF_ONE:
        assert outcome(getattr(fast, name), text) == outcome(getattr(reference, name), text), name
    for name in FUNCTIONS_OF_TWO:
        assert outcome(getattr(fast, name), text, other) == outcome(getattr(reference, name), text, other), name


def test_a_long_topic_is_refused_the_same() -> None:
    fast, reference = compiled(TOPICS), interpreted(TOPICS)
    for text in ("a" * 65_535, "a" * 65_536, "é" * 32_768, "é" * 32_767):
        assert outcome(fast.validate_topic_name, text) == outcome(reference.validate_topic_name, text)
