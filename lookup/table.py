"""The owner's side of the embedded lookup, sans-IO: the entries of the slots this node owns,
client id -> node and queue -> nodes, indexed by node so that one node's entries can be
replaced wholesale (its re-registration after a membership change) or dropped (it died)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .api import smallest


class OwnerTable:
    __slots__ = ("_clients", "_interests", "_node_clients", "_node_queues")

    def __init__(self) -> None:
        self._clients: dict[str, str] = {}
        self._interests: dict[str, set[str]] = {}
        self._node_clients: dict[str, set[str]] = {}
        self._node_queues: dict[str, set[str]] = {}

    # -- writes ---------------------------------------------------------------------------
    def online(self, client_id: str, node_id: str) -> str | None:
        """Register ``client_id`` at ``node_id``; the node it was at before, if another one."""
        previous = self._clients.get(client_id)
        self._clients[client_id] = node_id
        self._node_clients.setdefault(node_id, set()).add(client_id)
        if previous is None or previous == node_id:
            return None
        self._discard_index(self._node_clients, previous, client_id)
        return previous

    def offline(self, client_id: str, node_id: str) -> None:
        """Forget ``client_id`` if it is still registered at ``node_id`` (not taken over)."""
        if self._clients.get(client_id) == node_id:
            del self._clients[client_id]
        self._discard_index(self._node_clients, node_id, client_id)

    def add_interest(self, queue: str, node_id: str) -> None:
        self._interests.setdefault(queue, set()).add(node_id)
        self._node_queues.setdefault(node_id, set()).add(queue)

    def remove_interest(self, queue: str, node_id: str) -> None:
        nodes = self._interests.get(queue)
        if nodes is not None:
            nodes.discard(node_id)
            if not nodes:
                del self._interests[queue]
        self._discard_index(self._node_queues, node_id, queue)

    def replace(self, node_id: str, clients: Iterable[str], queues: Iterable[str]) -> None:
        """Make ``node_id``'s entries exactly ``clients`` and ``queues``: its re-registration.
        A client meanwhile registered at another node stays there (that is the newer state)."""
        for client_id in self._node_clients.pop(node_id, ()):
            if self._clients.get(client_id) == node_id:
                del self._clients[client_id]
        for queue in self._node_queues.pop(node_id, ()):
            nodes = self._interests.get(queue)
            if nodes is not None:
                nodes.discard(node_id)
                if not nodes:
                    del self._interests[queue]
        self.extend(node_id, clients, queues)

    def extend(self, node_id: str, clients: Iterable[str], queues: Iterable[str]) -> None:
        """Add to ``node_id``'s entries (the later chunks of a re-registration)."""
        for client_id in clients:
            holder = self._clients.get(client_id)
            if holder is None or holder == node_id:
                self._clients[client_id] = node_id
                self._node_clients.setdefault(node_id, set()).add(client_id)
        for queue in queues:
            self._interests.setdefault(queue, set()).add(node_id)
            self._node_queues.setdefault(node_id, set()).add(queue)

    def retain(self, owns: Callable[[str], bool], members: frozenset[str]) -> None:
        """Drop the entries of keys this node no longer owns and of nodes no longer members."""
        self._clients = {c: n for c, n in self._clients.items() if n in members and owns(c)}
        interests = {}
        for queue, nodes in self._interests.items():
            live = nodes & members
            if live and owns(queue):
                interests[queue] = live
        self._interests = interests
        self._node_clients, self._node_queues = {}, {}
        for client_id, node_id in self._clients.items():
            self._node_clients.setdefault(node_id, set()).add(client_id)
        for queue, nodes in self._interests.items():
            for node_id in nodes:
                self._node_queues.setdefault(node_id, set()).add(queue)

    # -- reads ----------------------------------------------------------------------------
    def where(self, client_id: str) -> str | None:
        return self._clients.get(client_id)

    def nodes_for(self, queue: str) -> frozenset[str]:
        return frozenset(self._interests.get(queue, ()))

    def list_clients(self, prefix: str, limit: int) -> list[tuple[str, str]]:
        return smallest(((c, n) for c, n in self._clients.items() if c.startswith(prefix)), limit)

    def __len__(self) -> int:
        return len(self._clients) + len(self._interests)

    @staticmethod
    def _discard_index(index: dict[str, set[str]], node_id: str, key: str) -> None:
        keys = index.get(node_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del index[node_id]
