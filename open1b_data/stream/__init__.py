"""The topologically invariant stream over a built mix: plan, windows, state, loader."""
