"""The training schedule: steps, batch ramp, learning rate and rank assignment (SPEC 3).

Pure arithmetic on a ``ScheduleSpec`` (from the mix definition); no stream, no I/O.

Exact rule (STREAM.md section 8 restates it):

* Steps are numbered from 1. ``tokens_before(s)`` is the number of tokens consumed by steps
  ``1 .. s-1``, counting ``seq_tokens`` (4,096) tokens per sequence; ``tokens_after(s) =
  tokens_before(s) + B(s) * seq_tokens``.
* ``B(s)``, the step's batch in sequences (= windows), is the ``batch_sequences`` of the last
  phase whose ``start_tokens <= tokens_before(s)``.
* Training stops after the first step with ``tokens_after(s) >= stop_tokens``; that step is
  ``last_step``. Later steps do not exist.
* Step s consumes the contiguous stream windows ``[first, first + B(s))`` with ``first =
  tokens_before(s) / seq_tokens`` (the windows consumed before it).
* Learning rate, a function of consumed tokens evaluated at ``t = tokens_after(s)`` (the
  tokens consumed once step s is applied, so step 1 already gets a non-zero rate and the
  last step gets exactly the final rate): ``lr_peak * t / warmup_tokens`` while ``t <
  warmup_tokens``; afterwards ``lr_final + (lr_peak - lr_final) * (1 + cos(pi * p)) / 2``
  with ``p = min(1, (t - warmup_tokens) / (stop_tokens - warmup_tokens))`` and ``lr_final =
  lr_peak * lr_final_ratio``. Binary64, in exactly this order; p is the exact rational and
  cos(pi p) the correctly rounded value of ``cospi.py`` (libm's cos is not portable).
* Rank r of an R-way data-parallel job owns window m iff ``m mod R == r``. Within a step a
  rank's ``B/R`` windows, ascending, are cut into micro-batches of ``micro_batch``
  consecutive ones; ``accumulation = B / (R * micro_batch)``. R with ``B mod (R *
  micro_batch) != 0`` is refused with ``StreamError`` (some rank would idle or hold a short
  micro-batch).

Step lookup is closed form per phase (a few "runs" of equal batch), never a loop over steps.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from fractions import Fraction

from open1b_data.errors import ManifestError, StreamError
from open1b_data.formats.definition import ScheduleSpec, default_mix_path, load_mix
from open1b_data.stream.cospi import cos_pi


@dataclass(frozen=True)
class Run:
    """Consecutive steps with the same batch: steps ``first_step .. first_step+steps-1``."""

    first_step: int
    steps: int
    batch: int               # sequences (windows) per step
    tokens_before: int       # tokens consumed before first_step


@dataclass(frozen=True)
class StepInfo:
    step: int
    phase: int               # index into spec.phases
    batch_sequences: int
    tokens_before: int
    tokens_after: int
    first_window: int        # the step's windows are [first_window, first_window + batch)
    lr: float

    @property
    def windows(self) -> range:
        return range(self.first_window, self.first_window + self.batch_sequences)


@dataclass(frozen=True)
class RankPlan:
    """What rank r of R loads in one step: ``micro_batches[j]`` is a tuple of window ids."""

    rank: int
    world: int
    accumulation: int
    micro_batches: tuple[tuple[int, ...], ...]


def _runs(spec: ScheduleSpec) -> tuple[Run, ...]:
    runs: list[Run] = []
    step, tokens = 1, 0
    phases = spec.phases
    while tokens < spec.stop_tokens:
        i = bisect.bisect_right([p.start_tokens for p in phases], tokens) - 1
        per_step = phases[i].batch_sequences * spec.seq_tokens
        end = spec.stop_tokens
        if i + 1 < len(phases):
            end = min(end, phases[i + 1].start_tokens)
        n = max(1, -(-(end - tokens) // per_step))   # steps while tokens_before < end
        runs.append(Run(step, n, phases[i].batch_sequences, tokens))
        step += n
        tokens += n * per_step
    return tuple(runs)


class Schedule:
    """Closed-form queries on one ``ScheduleSpec`` (see module docstring)."""

    def __init__(self, spec: ScheduleSpec) -> None:
        self.spec = spec
        self.runs = _runs(spec)
        last = self.runs[-1]
        self.last_step = last.first_step + last.steps - 1
        self.total_tokens = last.tokens_before + last.steps * last.batch * spec.seq_tokens
        self.total_windows = self.total_tokens // spec.seq_tokens
        self._run_steps = [r.first_step for r in self.runs]
        self._run_tokens = [r.tokens_before for r in self.runs]
        self._starts = [p.start_tokens for p in spec.phases]

    @classmethod
    def from_definition(cls, definition: dict | None) -> "Schedule":
        """Schedule of a built mix's ``definition`` (manifest.json); None = the Open-1B one."""
        from open1b_data.formats.definition import _parse_schedule

        if definition is None:
            return cls(open1b_spec())
        raw = definition.get("schedule")
        if not isinstance(raw, dict):
            raise ManifestError(f"definition.schedule: expected a table, got {raw!r}; the "
                                f"manifest is malformed, rebuild the mix")
        spec = _parse_schedule(raw, "definition.schedule")
        window = definition.get("window")
        if window != spec.seq_tokens + 1:
            # Windows of another length than seq_tokens + 1 would not tile the steps.
            raise ManifestError(f"definition.window: {window!r}, but the schedule's "
                                f"seq_tokens + 1 = {spec.seq_tokens + 1}; the manifest is "
                                f"inconsistent, rebuild the mix")
        return cls(spec)

    def _check_step(self, step: int) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise StreamError(f"step must be an integer >= 1 (steps are numbered from 1), "
                              f"got {step!r}")
        if step > self.last_step:
            raise StreamError(f"step {step} is past the end of the schedule: training stops "
                              f"after step {self.last_step} ({self.total_tokens:,} tokens)")

    def step(self, step: int) -> StepInfo:
        """Batch, token counts, windows and learning rate of ``step``."""
        self._check_step(step)
        r = self.runs[bisect.bisect_right(self._run_steps, step) - 1]
        before = r.tokens_before + (step - r.first_step) * r.batch * self.spec.seq_tokens
        after = before + r.batch * self.spec.seq_tokens
        phase = bisect.bisect_right(self._starts, before) - 1
        return StepInfo(step, phase, r.batch, before, after, before // self.spec.seq_tokens,
                        self.lr_at(after))

    def step_of_token(self, token: int) -> int:
        """The step that consumes token ``token`` (0-based: tokens_before <= token <
        tokens_after)."""
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise StreamError(f"token index must be an integer >= 0, got {token!r}")
        if token >= self.total_tokens:
            raise StreamError(f"token {token:,} is never consumed: the schedule ends after "
                              f"{self.total_tokens:,} tokens (step {self.last_step})")
        r = self.runs[bisect.bisect_right(self._run_tokens, token) - 1]
        return r.first_step + (token - r.tokens_before) // (r.batch * self.spec.seq_tokens)

    def step_of_window(self, window: int) -> int:
        """The step whose window range holds stream window ``window``."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise StreamError(f"window index must be an integer >= 0, got {window!r}")
        if window >= self.total_windows:
            raise StreamError(f"window {window:,} is never trained on: the schedule ends "
                              f"with window {self.total_windows - 1:,} (step {self.last_step})")
        return self.step_of_token(window * self.spec.seq_tokens)

    def lr_at(self, tokens: int) -> float:
        """Learning rate after ``tokens`` consumed tokens (see module docstring)."""
        s = self.spec
        if tokens < s.warmup_tokens:
            return s.lr_peak * tokens / s.warmup_tokens
        final = s.lr_peak * s.lr_final_ratio
        p = min(Fraction(1), Fraction(tokens - s.warmup_tokens, s.stop_tokens - s.warmup_tokens))
        return final + (s.lr_peak - final) * 0.5 * (1.0 + cos_pi(p))   # cospi.py: portable

    def accumulation(self, step: int, world: int) -> int:
        """Micro-batches per rank in ``step`` for ``world`` ranks; refuses bad world sizes."""
        info = self.step(step)
        _check_world(world, 0)
        mb = self.spec.micro_batch
        if info.batch_sequences % (world * mb):
            good = [r for r in range(1, info.batch_sequences // mb + 1)
                    if info.batch_sequences % (r * mb) == 0]
            raise StreamError(
                f"world size {world} does not fit step {step}: its batch of "
                f"{info.batch_sequences} windows is not a multiple of world * micro_batch = "
                f"{world} * {mb}, so some rank would idle; use one of {good}")
        return info.batch_sequences // (world * mb)

    def rank_plan(self, step: int, world: int, rank: int) -> RankPlan:
        """The micro-batches (window ids) rank ``rank`` of ``world`` loads in ``step``."""
        acc = self.accumulation(step, world)
        _check_world(world, rank)
        first = self.step(step).first_window
        start = first + (rank - first) % world       # first window of the step this rank owns
        mb = self.spec.micro_batch
        wins = range(start, start + acc * mb * world, world)
        return RankPlan(rank, world, acc,
                        tuple(tuple(wins[j * mb:(j + 1) * mb]) for j in range(acc)))


def _check_world(world: int, rank: int) -> None:
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise StreamError(f"world size must be an integer >= 1, got {world!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise StreamError(f"rank must be an integer in [0, {world}) for world size {world}, "
                          f"got {rank!r}")


def rank_of(window: int, world: int) -> int:
    """The rank that loads ``window`` in an R-way job: ``window mod world``."""
    _check_world(world, 0)
    return window % world


def open1b_spec() -> ScheduleSpec:
    """The Open-1B schedule (manifests/mix-0626.toml)."""
    import os

    path = os.path.join(os.path.dirname(default_mix_path()), "mix-0626.toml")
    return load_mix(path).schedule
