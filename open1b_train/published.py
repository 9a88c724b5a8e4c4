"""A published run's weights, tokenizer and config, checked against its chain before use.

The step audit checks steps; a user takes away something else - the released weights, an
export, the tokenizer. Every command that loads a run's weights for use (``open1b-train
generate`` / ``export``, ``open1b-eval``, the lm-eval model, ``open1b-audit verify-model``)
opens the run with ``open_published`` and takes the weights from ``PublishedRun.weights``.
Nothing a run's owner wrote is used unless it is hashed into the chain or re-derived:

1. the log must be one chain (``chain.check``) and, when the user pinned it
   (``--expect-run-hash``), end in the published run hash (``chain.pin``); when it is not
   pinned, ``notes`` says so plainly and the commands print it;
2. the config is ``config.json`` only if its identity is the one the genesis hashes;
   ``record.json``'s ``config`` is never read (it is not hashed: editing it once changed
   RoPE's theta and the attention window of every generation and export);
3. the mix: its fingerprint (recomputed from its manifest) must be the genesis's - and the
   announced one (``--expect-mix``) - and every tokenizer file is read once and must have
   the content digest the manifest lists (``open1b_data.formats.tokenizerfile``); users get
   those verified bytes, never a second read of the file;
4. the checkpoint at step N: its record's step hash must be the chain's at N and its mix
   fingerprint, seed and config identity the genesis's; the parameters' digest must be the
   log's step-N params digest (a swapped weight with its sha256 rewritten in ``record.json``
   fails here, named); checkpoint files hold exactly the model's tensors
   (``checkpoint.load``).

A run URL named by the run's own ``run.json`` is never followed: a user who wants a mix
elsewhere passes it (``read_run``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from open1b_train import chain, checkpoint, runlog, statehash
from open1b_train.config import ModelConfig, TrainConfig, from_dict
from open1b_train.errors import CheckpointError, Open1bTrainError
from open1b_train.params import param_specs
from open1b_train.recipe import Announcement


class PublishedError(Open1bTrainError):
    """A published run (or what is loaded from it) is not what its chain commits to."""


@dataclass
class PublishedRun:
    dir: str
    cfg: TrainConfig               # config.json, its identity the genesis's
    mix: str
    lines: list[dict[str, Any]]
    manifest: Any                  # open1b_data BuiltManifest, fingerprint the genesis's
    tokenizer_files: dict[str, bytes]   # manifest path -> verified bytes
    pinned: bool
    notes: list[str] = field(default_factory=list)

    @property
    def genesis(self) -> dict[str, Any]:
        return self.lines[0]["genesis"]

    @property
    def run_hash(self) -> str:
        return self.lines[-1]["hash"]

    @property
    def model(self) -> ModelConfig:
        return self.cfg.model

    @property
    def eot(self) -> int:
        return int(self.manifest.tokenizer["eot_id"])

    def tokenizer(self):
        """The verified ``tokenizer.json`` as a ``tokenizers.Tokenizer`` (text is encoded as
        text: a literal separator inside it is not the separator)."""
        from open1b_data.formats.tokenizerfile import tokenizer_from_bytes

        path = self.manifest.tokenizer["path"]
        return tokenizer_from_bytes(self.tokenizer_files[path], path)

    @property
    def tokenizer_digest(self) -> str:
        """sha256 over the manifest's tokenizer entries (path and content digest, in order):
        the tokenizer's identity as the mix's fingerprint covers it."""
        from open1b_data.formats.manifest import tokenizer_files

        return statehash.sha([[f["path"], f["content"]]
                              for f in tokenizer_files(self.manifest.tokenizer)])

    def weights(self, step: int) -> dict[str, torch.Tensor]:
        """The parameters of checkpoint ``step``, checked against the log (see the module
        docstring, 4)."""
        if not 0 <= step < len(self.lines):
            raise PublishedError(f"{self.dir}: its log has steps 0..{len(self.lines) - 1}; "
                                 f"there is no step {step} to load")
        path = checkpoint.step_dir(self.dir, step)
        try:
            ck = checkpoint.load(path, params_only=True)
        except CheckpointError as e:
            raise PublishedError(str(e)) from None
        why = checkpoint.record_difference(ck.record, self.lines, step)
        if why:
            raise PublishedError(f"{path}: {why}")
        names = [s.name for s in param_specs(self.model)]
        missing = [n for n in names if n not in ck.params]
        extra = sorted(set(ck.params) - set(names))
        if missing or extra:
            raise PublishedError(f"{path}: params.safetensors "
                                 + (f"lacks {missing[:3]}" if missing else
                                    f"holds tensors {extra[:3]} that are not the model's")
                                 + "; it is not a checkpoint of this run's model")
        params = {n: ck.params[n] for n in names}
        want = self.lines[step]["components"]["params"] if step else self.genesis["params"]
        if statehash.tensors_digest(params) != want:
            raise PublishedError(f"{path}: its parameters are not step {step}'s: their digest "
                                 f"differs from the log's (the weights were swapped or edited "
                                 f"after training); use the run's own checkpoint")
        return params


def hashed_config(run_dir: str, genesis: dict[str, Any]) -> TrainConfig:
    """``RUN/config.json`` if its identity is the one the genesis hashes."""
    from open1b_train.run import CONFIG
    from open1b.safeio import read_json_object

    cfg = from_dict(read_json_object(os.path.join(run_dir, CONFIG), "run config",
                                     PublishedError))
    if cfg.identity_sha256() != genesis.get("config_identity"):
        raise PublishedError(f"{run_dir}/{CONFIG} is not the config the run's genesis hashes "
                             f"(identity {cfg.identity_sha256()[:16]}..., genesis "
                             f"{str(genesis.get('config_identity'))[:16]}...): it was edited")
    return cfg


def open_published(run_dir: str, mix: str | None = None,
                   announce: Announcement = Announcement()) -> PublishedRun:
    """Open ``run_dir`` for use (see the module docstring, 1-3); a ``PublishedError`` names
    what is not as the chain commits."""
    from open1b_data.errors import Open1bDataError
    from open1b_data.formats.manifest import load_manifest
    from open1b_data.formats.tokenizerfile import verified_tokenizer_files
    from open1b_train.run import read_run

    if not os.path.lexists(runlog.path_of(run_dir)):
        raise PublishedError(f"{run_dir}: no steps.jsonl; not a run directory")
    log = runlog.read_log(run_dir, error=PublishedError)
    f = chain.check(log.lines)
    if f is not None:
        raise PublishedError(f"{run_dir}: its log is not one chain ({f}); nothing from it can "
                             f"be checked")
    notes = []
    if announce.run_hash is not None:
        f = chain.pin(log.lines, announce.run_hash, log.partial_bytes)
        if f is not None:
            raise PublishedError(f"{run_dir} is not the published run: {f}")
    else:
        notes.append(f"the run hash is not pinned (give --expect-run-hash H, H the hash its "
                     f"owner published): the weights are checked against this log "
                     f"({log.lines[-1]['hash'][:16]}...), which may not be the published run")
    genesis = log.lines[0]["genesis"]
    cfg = hashed_config(run_dir, genesis)
    why = announce.refusal(genesis, cfg.preset)
    if why:
        raise PublishedError(f"{run_dir}: {why}")
    try:
        _, mix = read_run(run_dir, mix)
        manifest = load_manifest(mix)
        files = verified_tokenizer_files(mix, manifest)
    except Open1bDataError as e:
        raise PublishedError(f"{run_dir}: its mix cannot be read as published: {e}") from None
    if manifest.fingerprint != genesis.get("mix_fingerprint"):
        raise PublishedError(f"mix {mix} has fingerprint {manifest.fingerprint[:16]}..., the "
                             f"run's genesis names {str(genesis.get('mix_fingerprint'))[:16]}"
                             f"...: it is not the run's mix (pass --mix with the right one)")
    return PublishedRun(run_dir, cfg, mix, log.lines, manifest, files,
                        announce.run_hash is not None, notes)


def released_weights(run_dir: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's released weights - its checkpoint at the last logged step - compared with
    the log without replaying anything: ``{"step", "compared", "matches", "detail"}``.
    (A replay of the last step starts from the checkpoint before it, so a swap of the last
    one is invisible to it unless it compares the published state, as ``replay`` now does;
    this answers the same question for ``coverage`` from the log alone.)"""
    last = len(lines) - 1
    steps = checkpoint.list_steps(run_dir)
    if last not in steps:
        latest = f" (latest: step {steps[-1]})" if steps else ""
        return {"step": last, "compared": False, "matches": None,
                "detail": f"the run publishes no checkpoint at its last step {last}{latest}: "
                          f"no released weights are tied to the run hash"}
    try:
        pub = PublishedRun(run_dir, hashed_config(run_dir, lines[0]["genesis"]), "", lines,
                           None, {}, False)
    except Open1bTrainError as e:
        return {"step": last, "compared": False, "matches": None,
                "detail": f"the model's config cannot be checked ({e})"}
    try:
        pub.weights(last)
    except PublishedError as e:
        return {"step": last, "compared": True, "matches": False, "detail": str(e)}
    return {"step": last, "compared": True, "matches": True,
            "detail": f"the checkpoint of step {last} has the log's parameters digest"}

