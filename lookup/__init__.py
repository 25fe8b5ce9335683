"""Lookup KV of online state (client id -> node, queue -> interested nodes) over a consistent-hash ring."""
