"""Mix 0626 builder and the topologically invariant stream.

Data flows one way: ``open1b_data.ingest`` (readers -> filters -> tokenizer) writes what
``open1b_data.formats`` defines (the mix definition, token shards + lengths, Merkle trees,
the manifest), which ``open1b_data.stream`` reads (plan -> windows -> state -> loader) and
``open1b_data.explore`` inspects (stream-at, statistics, provenance, proofs);
``open1b_data.cli`` is the thin ``open1b-data`` layer on top. The public entry points are
importable from here (lazily, so ``import open1b_data`` stays cheap)::

    from open1b_data import StreamLoader, StreamPlan, Schedule, load_manifest
"""

__version__ = "0.1.0"

# name -> module that defines it (imported on first access)
_PUBLIC = {
    "StreamLoader": "open1b_data.stream.loader",
    "StreamPlan": "open1b_data.stream.plan",
    "StreamState": "open1b_data.stream.state",
    "Schedule": "open1b_data.stream.schedule",
    "WindowReader": "open1b_data.stream.windows",
    "window_sha256": "open1b_data.stream.windows",
    "MixView": "open1b_data.stream.mixview",
    "BuiltManifest": "open1b_data.formats.manifest",
    "load_manifest": "open1b_data.formats.manifest",
    "MixSpec": "open1b_data.formats.definition",
    "load_mix": "open1b_data.formats.definition",
    "build_mix": "open1b_data.ingest.pipeline",
    "BuildOptions": "open1b_data.ingest.pipeline",
    "Open1bDataError": "open1b_data.errors",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'open1b_data' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
