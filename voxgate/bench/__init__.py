"""Benchmarks and measurement helpers: real servers on loopback, JSON results."""
