"""The one exception hierarchy of ``open1b_train``: every error a user can cause names the
offending value and says what to do."""


from open1b.errors import Open1bError


class Open1bTrainError(Open1bError):
    """Base of every error raised on purpose by open1b_train."""


class ConfigError(Open1bTrainError):
    """An invalid training config (names the field and the bad value)."""


class CheckpointError(Open1bTrainError):
    """A checkpoint is missing, corrupt, or belongs to another run."""


class ResumeError(Open1bTrainError):
    """A run cannot resume: another mix, seed or config, or a log that disagrees."""


class DivergenceError(Open1bTrainError):
    """A non-finite loss or gradient: the run stops and keeps its last good checkpoint."""


class ReproducibilityError(Open1bTrainError):
    """A recomputed step differs from what the run logged before (same inputs, other bits)."""


class MemoryPlanError(Open1bTrainError):
    """A memory plan cannot run: its scratch files, or a forced plan over free memory."""


class SpillError(Open1bTrainError):
    """A file this process spilled to disk (a TreeFold partial) changed before it was read
    back: a local fault, not a property of the run being replayed."""
