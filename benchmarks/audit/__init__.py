"""Benchmarks of open1b_audit: tampering caught, the cost of a replay, and the bytes one
audited step fetches."""
