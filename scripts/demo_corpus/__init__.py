"""The demo corpus extractor's parts, one per upstream format of Mix 0626 (dclm, fineweb,
stack, proofpile) plus the shared records writers and the license copies; the entry point
and the version check are ``scripts/make_demo_corpus.py``."""
