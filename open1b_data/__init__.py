"""Mix 0626 builder and the topologically invariant stream.

Two systems, data flowing one way: ``open1b_data.build`` (mix definition -> readers ->
filters -> tokenizer -> token shards + manifest) and ``open1b_data.stream`` (plan -> windows
-> state -> loader, provenance); ``open1b_data.cli`` is the thin ``open1b-data`` layer on
top. The public entry points are importable from here (lazily, so ``import open1b_data``
stays cheap)::

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
    "BuiltManifest": "open1b_data.build.manifest",
    "load_manifest": "open1b_data.build.manifest",
    "MixSpec": "open1b_data.build.definition",
    "load_mix": "open1b_data.build.definition",
    "build_mix": "open1b_data.build.pipeline",
    "BuildOptions": "open1b_data.build.pipeline",
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
