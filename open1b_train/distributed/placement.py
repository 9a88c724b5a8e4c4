"""Where the virtual ranks of a logical mesh live on P physical processes.

Virtual rank ``v = rep * S + shard`` (replica-major). Process p of P runs the contiguous
block ``[p * k, (p + 1) * k)`` with ``k = V / P`` (P must divide V = R * S), in mesh order,
so its data loader serves one contiguous range of ranks. Logical shard s of the flat
parameter space (``Layout.shards(S)``) is owned by every virtual rank (r, s); its
*designated* owner - the one that updates it, writes its optimizer checkpoint file and
hashes it - is virtual rank (0, s) = s, on process ``s // k``.
"""
from __future__ import annotations

from dataclasses import dataclass

from open1b_train.errors import ConfigError


@dataclass(frozen=True)
class Placement:
    replicas: int        # R
    shards: int          # S
    procs: int           # P
    rank: int            # this process

    def __post_init__(self) -> None:
        v = self.replicas * self.shards
        if self.procs < 1 or v % self.procs:
            good = [p for p in range(1, v + 1) if v % p == 0]
            raise ConfigError(f"{self.procs} processes cannot run a {self.replicas}x"
                              f"{self.shards} mesh ({v} virtual ranks): the process count "
                              f"must divide {v}; use one of {good}")
        if not 0 <= self.rank < self.procs:
            raise ConfigError(f"process rank {self.rank} out of range [0, {self.procs})")

    @property
    def virtual(self) -> int:
        return self.replicas * self.shards

    @property
    def per_proc(self) -> int:
        return self.virtual // self.procs

    def host(self, v: int) -> int:
        return v // self.per_proc

    @property
    def local(self) -> range:
        return range(self.rank * self.per_proc, (self.rank + 1) * self.per_proc)

    def rep(self, v: int) -> int:
        return v // self.shards

    def shard(self, v: int) -> int:
        return v % self.shards

    def vrank(self, rep: int, shard: int) -> int:
        return rep * self.shards + shard

    def owner(self, s: int) -> int:
        """The process of shard s's designated owner, virtual rank (0, s)."""
        return self.host(s)

    @property
    def owned_shards(self) -> list[int]:
        """Logical shards this process is the designated owner of."""
        return [s for s in range(self.shards) if self.owner(s) == self.rank]
