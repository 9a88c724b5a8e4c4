"""The exceptions of ``open1b_audit``: every error it raises on purpose is an
``Open1bAuditError`` naming the offending value and what to do."""
from open1b.errors import Open1bError


class Open1bAuditError(Open1bError):
    """Base of every error raised on purpose by open1b_audit."""


class CertificateError(Open1bAuditError):
    """A certificate that is malformed or whose signature does not verify."""


class SiteError(Open1bAuditError):
    """The run explorer cannot render what it was asked for."""


class SelftestError(Open1bAuditError):
    """``open1b-audit selftest`` cannot run (its shipped data is missing or damaged)."""
