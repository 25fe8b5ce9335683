"""The remoting codec's one error: input that is not a valid remoting frame or header."""


class RemotingProtocolError(ValueError):
    """Malformed, truncated-beyond-repair or oversized remoting input."""
