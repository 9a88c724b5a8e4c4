"""Read-side tools over a built mix and its stream, for people asking what training saw:
``stream-at`` (``inspect.py``) and its batch statistics (``stats.py``), where a document or
phrase was seen (``provenance.py``), documents proved against their shard's Merkle root
and the windows rebuilt from them (``proof.py``), and the source composition over steps
(``plotmix.py``). They read the stream (``open1b_data.stream``) and never define it: the
stream imports nothing from here.
"""
