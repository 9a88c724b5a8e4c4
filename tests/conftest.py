"""Suite-wide: the shared built mixes and reference run (``testkit/runs.py``); and
the long tests are collected first, so that with ``pytest -n 2`` (``make
test``) the two workers start on them and the short tests fill in around them, instead of
one worker ending on a five-minute test while the other idles."""
from __future__ import annotations

from testkit.runs import mix4, mix12, ref_run  # noqa: F401 (suite-wide fixtures)

# the longest first (minutes each on 2 cores), then every other ``slow`` test
LONGEST = ("test_every_registered_op_compiles_for_sm90_without_a_forbidden_instruction",
           "test_cpu_reference_and_triton_path_give_the_same_step_hashes",
           "test_every_process_count_gives_the_single_process_bits",
           "test_provenance_always_exits_cleanly",
           "test_stream_at_always_exits_cleanly")


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        name = item.originalname or item.name
        if name in LONGEST:
            return LONGEST.index(name)
        return len(LONGEST) + (0 if item.get_closest_marker("slow") else 1)

    items.sort(key=rank)           # stable: collection order within a rank
