"""AMQP 0-9-1, sans-IO: frames in and out through pamqp (which owns the method tables), content
assembly per channel, and the protocol's reply codes."""
