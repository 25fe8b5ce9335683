"""The error of a rule definition refused when it is given (admin API, configuration)."""

from __future__ import annotations


class RuleDefinitionError(ValueError):
    """A definition refused: ``path`` is where in it (``$`` is the whole definition), ``reason`` why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
