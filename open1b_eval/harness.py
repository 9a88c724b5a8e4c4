"""An lm-evaluation-harness model ``open1b`` on the reproducible runtime.

    lm_eval --model open1b --model_args run=RUN,step=N --tasks arc_easy
    python -c "import lm_eval; lm_eval.simple_evaluate(model='open1b', ...)"

lm-eval (0.4.x) discovers models only through its own registry, with no entry-point group;
the installed package's startup hook (``open1b_eval.lmeval_hook``) registers ``open1b``
there as the lazy target ``open1b_eval.harness:Open1bLM`` in every interpreter, so lm-eval's
own command line and API know it and import this module only when a run asks for it.
Importing this module registers the class too (for an interpreter started without
``site``, ``python -S``).

Model arguments: ``run`` (a run directory), ``step`` (default: the latest checkpoint),
``expect_run_hash`` (the run hash its owner published: a run whose log does not end in it
is refused; without it the weights are checked against the run's own log and a warning
says so - ``open1b_eval.trained``),
``backend`` (auto | cpu | triton), ``max_length`` (tokens a scored sequence keeps, the
rightmost; default 8,192, RoPE's domain), ``batch_size`` (sequences decoded together by
``generate_until``; results do not depend on it).

Scores. A request's text becomes ids as ``open1b_eval.trained`` does (the separator
first, then the byte-level BPE of the text); ``loglikelihood`` splits (context,
continuation) like the harness's HF model (trailing spaces of the context move to the
continuation; the continuation's ids are those of the whole text past the context's). The
logits are the runtime's, bit-identical on every machine and backend; a token's
log-probability is ``logit - logsumexp(logits)`` in float64 (torch), summed in float64.
``loglikelihood_rolling`` uses the harness's disjoint rolling windows of ``max_length``.
``generate_until`` is greedy decoding (``open1b_eval.generate``; sampling when the task
sets ``do_sample`` with a ``temperature`` > 0, seed ``seed``), stopped at the separator or
``max_gen_toks`` and cut at the first ``until`` string.
"""
from __future__ import annotations

import warnings

import lm_eval.models  # noqa: F401  (lm-eval's own models first: see ``register_model`` below)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from open1b_kernels.core import backend as kbackend
from open1b_kernels.ops.rope import MAX_T
from open1b_eval.decoder import Decoder
from open1b_eval.generate import generate
from open1b_eval.scoring import token_logprobs
from open1b_eval.trained import load


def _backend(name: str):
    if name not in ("auto", "cpu", "triton"):
        raise ValueError(f"backend must be auto, cpu or triton, got {name!r}")
    return kbackend.force(None if name == "auto" else name)   # auto: by device


# lm-eval fills its registry with its own models only while the registry is empty, so they
# are registered (lm_eval.models, above) before this class; where the startup hook has
# registered the lazy target "open1b_eval.harness:Open1bLM", this replaces it by the class.
@register_model("open1b")
class Open1bLM(LM):
    def __init__(self, run: str, step: int | None = None, backend: str = "auto",
                 max_length: int = MAX_T, batch_size: int | str = 8, seed: int = 0,
                 expect_run_hash: str | None = None, **kwargs) -> None:
        super().__init__()
        self.trained = load(run, None if step in (None, "") else int(step),
                            expect=expect_run_hash or None)
        for note in self.trained.notes:
            warnings.warn(f"open1b {run}: {note}", stacklevel=2)
        self.backend = backend
        with _backend(backend):
            self.dec = Decoder(self.trained.cfg, self.trained.params)
        self.max_length = min(int(max_length), MAX_T)
        self.batch = max(1, int(batch_size)) if str(batch_size).isdigit() else 8
        self.seed = int(seed)

    # ------------------------------------------------------------------ scoring
    def token_logprobs(self, ids: list[int]) -> tuple[list[float], list[bool]]:
        """Log-probability of ids[1:] each given the ids before it, and whether each was
        the greedy (argmax) token; the model's input (ids[:-1]) is cut to the rightmost
        ``max_length`` tokens."""
        with _backend(self.backend):
            return token_logprobs(self.dec, ids[-(self.max_length + 1):])

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        n = len(context) - len(context.rstrip())
        if n:
            context, continuation = context[:-n], context[-n:] + continuation
        whole = self.trained.encode_prompt(context + continuation)
        ctx = self.trained.encode_prompt(context)
        return ctx, whole[len(ctx):]

    def loglikelihood_tokens(self, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
        if not cont:
            return 0.0, True
        lp, greedy = self.token_logprobs(ctx + cont)
        k = len(cont)
        return float(sum(lp[-k:])), all(greedy[-k:])

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        out = []
        for req in requests:
            ctx, cont = self._pair(*req.args)
            out.append(self.loglikelihood_tokens(ctx, cont))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for req in requests:
            ids = self.trained.encode(req.args[0])
            total = 0.0
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                    ids, prefix_token=self.trained.eot, max_seq_len=self.max_length,
                    context_len=1)):
                total += self.loglikelihood_tokens(list(ctx), list(cont))[0]
            out.append(total)
        return out

    # ------------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm: bool = False):
        out: list[str] = []
        reqs = [r.args for r in requests]
        chunks: list[list] = []
        for r in reqs:               # consecutive requests with the same gen_kwargs, batched
            if chunks and len(chunks[-1]) < self.batch and chunks[-1][0][1] == r[1]:
                chunks[-1].append(r)
            else:
                chunks.append([r])
        for chunk in chunks:
            kw = chunk[0][1] or {}
            until = kw.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.get("max_gen_toks", 256))
            temp = float(kw.get("temperature", 0.0)) if kw.get("do_sample") else 0.0
            prompts = [self.trained.encode_prompt(c)[-(self.max_length - max_new):]
                       for c, _ in chunk]
            with _backend(self.backend):
                gens = generate(self.dec, prompts, max_new, temp, self.seed,
                                stop_id=self.trained.eot)
            for g in gens:
                text = self.trained.decode([t for t in g if t != self.trained.eot])
                for s in until:
                    if s and s in text:
                        text = text[:text.index(s)]
                out.append(text)
        return out

