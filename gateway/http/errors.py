"""The one error the HTTP handlers raise: a status and a message, answered as JSON by the app."""

from __future__ import annotations


class AdminError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
