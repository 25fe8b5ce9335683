"""Benchmarks and load tests that print figures; they are not tests."""
