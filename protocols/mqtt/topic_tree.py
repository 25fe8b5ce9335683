"""A topic-filter trie: which of many filters match one topic, in time bounded by the topic's
depth and the matching branches, not by the number of filters (Mosquitto's subs.c idea)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


class _Node(Generic[V]):
    __slots__ = ("children", "has_value", "value")

    def __init__(self) -> None:
        self.children: dict[str, _Node[V]] = {}
        self.value: V | None = None
        self.has_value = False


class TopicTree(Generic[V]):
    """filter -> value; ``match(topic)`` yields the (filter, value) of every matching filter."""

    def __init__(self) -> None:
        self._root: _Node[V] = _Node()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __contains__(self, topic_filter: str) -> bool:
        node = self._find(topic_filter)
        return node is not None and node.has_value

    def get(self, topic_filter: str, default: V | None = None) -> V | None:
        node = self._find(topic_filter)
        return node.value if node is not None and node.has_value else default

    def _find(self, topic_filter: str) -> _Node[V] | None:
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node

    def __setitem__(self, topic_filter: str, value: V) -> None:
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if not node.has_value:
            self._size += 1
        node.value = value
        node.has_value = True

    def pop(self, topic_filter: str) -> V | None:
        """Remove a filter (and the branches it leaves empty); its value, or None."""
        path: list[tuple[_Node[V], str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            path.append((node, level))
            node = child
        if not node.has_value:
            return None
        value = node.value
        node.value = None
        node.has_value = False
        self._size -= 1
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.has_value or child.children:
                break
            del parent.children[level]
        return value

    def items(self) -> Iterator[tuple[str, V]]:
        stack: list[tuple[_Node[V], list[str]]] = [(self._root, [])]
        while stack:
            node, levels = stack.pop()
            if node.has_value and levels:
                yield "/".join(levels), node.value  # type: ignore[misc]  # (has_value: a V)
            for level, child in node.children.items():
                stack.append((child, levels + [level]))

    def match(self, topic: str) -> Iterator[tuple[str, V]]:
        """Every stored filter matching ``topic`` (MQTT rules, including the ``$`` rule)."""
        levels = topic.split("/")
        last = len(levels)
        dollar = topic.startswith("$")
        # (node, depth, filter levels so far)
        stack: list[tuple[_Node[V], int, tuple[str, ...]]] = [(self._root, 0, ())]
        while stack:
            node, depth, path = stack.pop()
            children = node.children
            hash_node = children.get("#")
            if hash_node is not None and hash_node.has_value and not (dollar and depth == 0):
                yield "/".join(path + ("#",)), hash_node.value  # type: ignore[misc]  # (has_value: a V)
            if depth == last:
                if node.has_value:
                    yield "/".join(path), node.value  # type: ignore[misc]  # (has_value: a V)
                continue
            level = levels[depth]
            exact = children.get(level)
            if exact is not None:
                stack.append((exact, depth + 1, path + (level,)))
            plus = children.get("+")
            if plus is not None and not (dollar and depth == 0):
                stack.append((plus, depth + 1, path + ("+",)))
