"""The owner's side of the embedded lookup, sans-IO: the entries of the slots this node owns,
client id -> node, indexed by node so that one node's entries can be replaced wholesale (its
re-registration after a membership change) or dropped (it died)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .api import smallest


class OwnerTable:
    __slots__ = ("_clients", "_node_clients")

    def __init__(self) -> None:
        self._clients: dict[str, str] = {}
        self._node_clients: dict[str, set[str]] = {}

    # -- writes ---------------------------------------------------------------------------
    def online(self, client_id: str, node_id: str) -> str | None:
        """Register ``client_id`` at ``node_id``; the node it was at before, if another one."""
        previous = self._clients.get(client_id)
        self._clients[client_id] = node_id
        self._node_clients.setdefault(node_id, set()).add(client_id)
        if previous is None or previous == node_id:
            return None
        self._discard_index(previous, client_id)
        return previous

    def offline(self, client_id: str, node_id: str) -> None:
        """Forget ``client_id`` if it is still registered at ``node_id`` (not taken over)."""
        if self._clients.get(client_id) == node_id:
            del self._clients[client_id]
        self._discard_index(node_id, client_id)

    def replace(self, node_id: str, clients: Iterable[str]) -> None:
        """Make ``node_id``'s entries exactly ``clients``: its re-registration. A client
        meanwhile registered at another node stays there (that is the newer state)."""
        for client_id in self._node_clients.pop(node_id, ()):
            if self._clients.get(client_id) == node_id:
                del self._clients[client_id]
        self.extend(node_id, clients)

    def extend(self, node_id: str, clients: Iterable[str]) -> None:
        """Add to ``node_id``'s entries (the later chunks of a re-registration)."""
        for client_id in clients:
            holder = self._clients.get(client_id)
            if holder is None or holder == node_id:
                self._clients[client_id] = node_id
                self._node_clients.setdefault(node_id, set()).add(client_id)

    def retain(self, owns: Callable[[str], bool], members: frozenset[str]) -> None:
        """Drop the entries of keys this node no longer owns and of nodes no longer members."""
        self._clients = {c: n for c, n in self._clients.items() if n in members and owns(c)}
        self._node_clients = {}
        for client_id, node_id in self._clients.items():
            self._node_clients.setdefault(node_id, set()).add(client_id)

    # -- reads ----------------------------------------------------------------------------
    def where(self, client_id: str) -> str | None:
        return self._clients.get(client_id)

    def list_clients(self, prefix: str, limit: int) -> list[tuple[str, str]]:
        return smallest(((c, n) for c, n in self._clients.items() if c.startswith(prefix)), limit)

    def __len__(self) -> int:
        return len(self._clients)

    def _discard_index(self, node_id: str, client_id: str) -> None:
        keys = self._node_clients.get(node_id)
        if keys is not None:
            keys.discard(client_id)
            if not keys:
                del self._node_clients[node_id]
