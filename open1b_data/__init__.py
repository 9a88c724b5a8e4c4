"""Mix 0626 builder and the topologically invariant stream."""

__version__ = "0.1.0"
