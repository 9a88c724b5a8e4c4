"""Building a mix: definition -> readers -> filters -> tokenizer -> shards + manifest."""
