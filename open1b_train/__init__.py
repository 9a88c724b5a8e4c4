"""Open-1B training on the reproducible runtime and the invariant stream (roadmap: the
training loop with per-step state hashes, checkpoints and bit-exact resume; deterministic
data-parallel training and the single-device audit replay)."""
