"""MQTT topic rules: validation, matching, shared filters, and the trie against plain matching."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.mqtt.topic_tree import TopicTree
from protocols.mqtt.topics import (
    TopicError,
    matches,
    parse_shared,
    validate_topic_filter,
    validate_topic_name,
)


@pytest.mark.parametrize("topic_filter, topic, expected", [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "$SYS/broker/uptime", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/broker/uptime", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("a/b", "a/b", True),
    ("a/b", "a/c", False),
])
def test_spec_examples(topic_filter: str, topic: str, expected: bool) -> None:
    assert matches(topic_filter, topic) is expected
    tree: TopicTree[int] = TopicTree()
    tree[topic_filter] = 1
    assert [f for f, _ in tree.match(topic)] == ([topic_filter] if expected else [])


@pytest.mark.parametrize("bad", ["", "a/#/b", "a#", "a/b+", "#/a", "a\x00b"])
def test_invalid_filters(bad: str) -> None:
    with pytest.raises(TopicError):
        validate_topic_filter(bad)


@pytest.mark.parametrize("bad", ["", "a/+", "a/#", "a\x00"])
def test_invalid_topic_names(bad: str) -> None:
    with pytest.raises(TopicError):
        validate_topic_name(bad)


def test_shared_filters() -> None:
    assert parse_shared("$share/g1/a/+") == ("g1", "a/+")
    assert parse_shared("a/b") == (None, "a/b")
    for bad in ("$share/g1", "$share//a", "$share/g+/a", "$share/g/a/#/b"):
        with pytest.raises(TopicError):
            parse_shared(bad)


levels = st.sampled_from(["a", "b", "c", "", "$x"])
topics = st.lists(levels, min_size=1, max_size=5).map("/".join).filter(bool)
filter_levels = st.sampled_from(["a", "b", "c", "", "+", "$x"])
filters = st.builds(
    lambda ls, tail: "/".join(ls + (["#"] if tail else [])) or "#",
    st.lists(filter_levels, min_size=0, max_size=4), st.booleans(),
)


@given(st.sets(filters, max_size=12), topics)
def test_tree_agrees_with_matches(filter_set: set[str], topic: str) -> None:
    tree: TopicTree[str] = TopicTree()
    for f in filter_set:
        tree[f] = f
    found = sorted(f for f, v in tree.match(topic) if f == v)
    assert found == sorted(f for f in filter_set if matches(f, topic))


@given(st.lists(filters, max_size=12), st.data())
def test_tree_pop_leaves_no_trace(filter_list: list[str], data: st.DataObject) -> None:
    tree: TopicTree[int] = TopicTree()
    for f in filter_list:
        tree[f] = 1
    unique = set(filter_list)
    assert len(tree) == len(unique)
    removed = data.draw(st.sets(st.sampled_from(sorted(unique))) if unique else st.just(set()))
    for f in removed:
        assert tree.pop(f) == 1
        assert f not in tree
    assert sorted(f for f, _ in tree.items()) == sorted(unique - removed)
    for f in unique - removed:
        tree.pop(f)
    assert len(tree) == 0 and not tree._root.children
