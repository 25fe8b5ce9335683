"""The one error the HTTP handlers raise: a status and a message, answered as JSON by the app."""

from __future__ import annotations


class AdminError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def no_store() -> AdminError:
    """What a request that reads the store gets where there is none: on a gateway node of a
    cluster (elsewhere the HTTP listener runs only while the node's own store is open)."""
    return AdminError(501, "this node holds no store (a gateway node of a cluster): ask the store node")
