"""The root of the project's exceptions. Each package has one subclass every error it
raises on purpose derives from (``Open1bDataError``, ``Open1bTrainError``,
``Open1bAuditError``), and each such error names the offending value and says what to do;
the command-line shell (``open1b.cli``) prints any ``Open1bError`` as one line."""


class Open1bError(Exception):
    """Base of every error raised on purpose by the project."""
