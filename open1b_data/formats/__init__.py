"""What a built mix is on disk, one noun per module (docs/FORMATS.md): the mix definition
and its TOML table (``definition``, ``tomltable``), ``manifest.json`` (``manifest``), token
shards and their lengths files (``shards``), per-shard Merkle trees (``merkle``) and the
confinement of paths read from a manifest (``mixpath``).

Readers and writers of these formats: ``open1b_data.ingest`` writes them, the stream, the
trainer and the auditor read them. Imports only ``open1b_data.errors`` and
``open1b_data.storage``.
"""
