"""docs/LOADER.md's examples are real: every ```python block runs, in order, against a
small built mix (``MIX``), two steps of its schedule (``END_STEP``)."""
import os
import re
import socket

import pytest
import torch

from testkit.s2mix import token_mix

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "LOADER.md")
BLOCKS = re.findall(r"```python\n(.*?)```", open(DOC).read(), flags=re.S)


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    return token_mix(str(tmp_path_factory.mktemp("doc")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_doc_has_examples():
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_example_runs(mix, i, monkeypatch):
    # what torchrun would set for a one-process job
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # the toy model's matmuls are tiny: spinning threads only cost
    try:
        exec(compile(BLOCKS[i], f"docs/LOADER.md block {i}", "exec"),
             {"MIX": mix, "END_STEP": 2, "__name__": "loader_doc"})
    finally:
        torch.set_num_threads(threads)
