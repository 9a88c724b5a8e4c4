"""What every benchmark report records about its machine: the CPU's generation (family,
model, stepping - two VMs both called "AMD EPYC" were Zen 4 and Zen 5) and its SIMD flags,
beside the date, command and load."""
from __future__ import annotations

import builtins
import io

from benchmarks import machine

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse4_1 avx2 fma avx512f avx512bw avx512_vnni

processor\t: 1
cpu family\t: 99
model\t\t: 99
"""


def _fake_open(text):
    real = builtins.open

    def fake(path, *args, **kwargs):
        if path == "/proc/cpuinfo":
            return io.StringIO(text)
        return real(path, *args, **kwargs)
    return fake


def test_report_head_names_the_cpu_generation_and_flags(monkeypatch):
    monkeypatch.setattr(builtins, "open", _fake_open(CPUINFO))
    assert machine.cpu_id() == "cpu family 25, model 17, stepping 1"   # the first CPU's
    head = machine.report_head("bench")
    assert "AMD EPYC (cpu family 25, model 17, stepping 1)" in head[1]
    assert head[2] == "SIMD: sse4_1 avx2 fma avx512f avx512bw avx512_vnni (AVX-512)"


def test_cpu_id_without_cpuinfo(monkeypatch):
    def missing(path, *args, **kwargs):
        raise OSError("no such file")
    monkeypatch.setattr(builtins, "open", missing)
    assert machine.cpu_id() == "unknown"
