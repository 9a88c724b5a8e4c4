"""Building a mix (``open1b-data build-mix``): the upstream sources' readers
(``sources/``), documents and the three ingest filters, the tokenizer (``tokenizer/``:
the training sample, BPE training, the fast encoder), tasks and their executors, the
pipeline that writes the formats of ``open1b_data.formats``, ``verify`` and the build
report. Nothing outside the ingest and the CLI imports it.
"""
