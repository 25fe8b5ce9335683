"""Event rules: event patterns compiled into matchers (``patterns``, with ``PatternSet`` to match
many rules at once, indexed by the fields they test) and the CloudEvents 1.0 view of a stored
message that patterns are matched against (``events``), both sans-IO; on them the rules engine
(``engine``: definitions, transforms, targets, one ``runner`` per rule), which the gateway hosts
(``gateway/rules_host.py``)."""

from .events import NO_DATA, CloudEvent, cloud_event
from .pattern_set import PatternSet
from .patterns import CompiledPattern, PatternError, compile_pattern

__all__ = ["NO_DATA", "CloudEvent", "CompiledPattern", "PatternError", "PatternSet", "cloud_event", "compile_pattern"]
