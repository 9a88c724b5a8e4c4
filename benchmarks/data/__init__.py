"""Benchmarks of open1b_data: build-mix throughput and scale, the tokenizer, Merkle trees,
manifest loading, the stream's plan at scale, ``stream-at`` latency and the loader."""
