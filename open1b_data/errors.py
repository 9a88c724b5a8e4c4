"""The one exception hierarchy of ``open1b_data``: every error a user can cause is an
``Open1bDataError`` whose message names the offending value and says what to do."""


from open1b.errors import Open1bError


class Open1bDataError(Open1bError):
    """Base of every error raised on purpose by open1b_data."""


class MixSpecError(Open1bDataError):
    """An invalid mix definition (names the field and the bad value)."""


class BuildError(Open1bDataError):
    """build-mix cannot go on (e.g. the two encoders disagree, an output is inconsistent)."""


class ManifestError(Open1bDataError):
    """A built mix's manifest is missing, malformed, or does not match its files."""


class ShardFormatError(Open1bDataError):
    """A shard or document-lengths file fails its magic/version/count checks."""


class StreamError(Open1bDataError):
    """A stream request that cannot be served (bad window/step, world size, ...)."""


class StateMismatchError(StreamError):
    """A stream state, seek index or checkpoint belongs to a different mix or seed."""


class StorageError(Open1bDataError):
    """Storage that cannot be reached at all: no credentials, no network, a wrong endpoint.
    Names the URL, the reason and what to set (``open1b_data.storage``). Deliberately not an
    ``OSError``: a build must stop here rather than count an input as unreadable data."""


class FileAccessError(StorageError, OSError):
    """One file or directory cannot be read or written (permission denied, a file where a
    directory should be, a full disk...). Also an ``OSError``, so code that counts an
    unreadable input file as bad data keeps doing so."""


class FileMissingError(FileAccessError, FileNotFoundError):
    """A file, directory or object that does not exist. Also a ``FileNotFoundError``, so a
    caller that gives absence a meaning ("build the mix first") can still catch it."""


class ProofError(Open1bDataError):
    """A document that its shard's Merkle root does not vouch for (names source, shard
    path, row and doc_id), or a mix whose shards have no roots to prove against."""


class TokenizerError(ManifestError):
    """A mix's tokenizer file whose content is not the one its manifest records (names the
    file, what differs and what to do)."""


class HeldOutError(StreamError):
    """A held-out document where training data was to be drawn, or held-out rows that are
    not the definition's rule (names the shard, row and doc_id)."""
