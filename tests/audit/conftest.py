"""The training tests' mixes and honest reference run, shared with the audit tests."""
from tests.train.conftest import _one_thread, mix4, mix12, ref_run  # noqa: F401
