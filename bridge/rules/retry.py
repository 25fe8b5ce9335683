"""A rule's retry policy: exponential backoff between attempts at a target, up to a number of
attempts and an age of the event, after which the event goes to the rule's dead-letter topic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import RuleDefinitionError

DEFAULTS = {"max_attempts": 185, "max_age_s": 86_400.0, "initial_backoff_ms": 100, "max_backoff_ms": 30_000,
            "multiplier": 2.0}
LIMITS = {"max_attempts": (1, 1_000_000), "max_age_s": (0.001, 30 * 86_400.0), "initial_backoff_ms": (1, 3_600_000),
          "max_backoff_ms": (1, 3_600_000), "multiplier": (1.0, 10.0)}


@dataclass(slots=True, frozen=True)
class RetryPolicy:
    max_attempts: int = 185  # deliveries tried per target, the first included
    max_age_s: float = 86_400.0  # since the event was stored
    initial_backoff_ms: int = 100
    max_backoff_ms: int = 30_000
    multiplier: float = 2.0

    @classmethod
    def parse(cls, raw: Any, path: str) -> RetryPolicy:
        """The policy of a definition's ``retry`` object (missing keys: the defaults)."""
        if not isinstance(raw, dict):
            raise RuleDefinitionError(path, "an object")
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in DEFAULTS:
                raise RuleDefinitionError(f"{path}.{key}", f"unknown key (known: {', '.join(DEFAULTS)})")
            low, high = LIMITS[key]
            whole = isinstance(DEFAULTS[key], int)
            if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) \
                    or not low <= value <= high:
                kind = "an integer" if whole else "a number"
                raise RuleDefinitionError(f"{path}.{key}", f"{kind} from {low} to {high}")
            values[key] = value
        policy = cls(**values)
        if policy.initial_backoff_ms > policy.max_backoff_ms:
            raise RuleDefinitionError(f"{path}.initial_backoff_ms", "at most max_backoff_ms")
        return policy

    def backoff_s(self, attempts: int) -> float:
        """The wait after the ``attempts``-th failed attempt."""
        delay = self.initial_backoff_ms * self.multiplier ** min(attempts - 1, 64)
        return min(delay, self.max_backoff_ms) / 1000

    def exhausted(self, attempts: int, age_s: float) -> str | None:
        """Why no more attempts are made (None: retry)."""
        if attempts >= self.max_attempts:
            return f"{attempts} attempts made (max_attempts {self.max_attempts})"
        if age_s >= self.max_age_s:
            return f"the event is {age_s:.1f} s old (max_age_s {self.max_age_s:g})"
        return None
