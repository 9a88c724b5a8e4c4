"""What a failed read, listing or write of a path or URL means, in one line a user can act on.

fsspec passes through whatever its backend raises: a local ``OSError``; for ``s3://``
botocore's ``NoCredentialsError`` or ``EndpointConnectionError`` and aiohttp's connection
errors (after s3fs has mapped 404/403 to ``FileNotFoundError``/``PermissionError``); for
``hf://`` huggingface_hub's and httpx's. None of them says which URL was meant or what to
set. ``failures(url, action)`` wraps one storage operation and re-raises such an exception
as the package's own (``open1b_data.errors``), named by the URL, the action, the reason and
the setting that fixes it:

* no credentials -> ``StorageError`` (``AWS_*`` for s3, ``HF_TOKEN`` for hf);
* no network or a wrong endpoint -> ``StorageError`` (``FSSPEC_S3_ENDPOINT_URL`` /
  ``AWS_ENDPOINT_URL`` for s3, the network or ``HF_ENDPOINT`` / ``HF_HUB_OFFLINE`` for hf);
* does not exist -> ``FileMissingError`` (also a ``FileNotFoundError``);
* any other ``OSError`` (permission denied, a file where a directory should be, a full
  disk) -> ``FileAccessError`` (also an ``OSError``).

Backend exceptions are recognised by class name along their MRO and cause chain, so this
module imports neither botocore, aiohttp, httpx nor huggingface_hub (each is optional).
Anything else - a bug, a ``ValueError`` of our own - passes through untouched, and so do
the package's own errors.
"""
from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

from open1b_data.errors import (FileAccessError, FileMissingError, Open1bDataError,
                                StorageError)

# Class names, wherever they sit in an exception's MRO or cause chain.
_NO_CREDENTIALS = frozenset({
    "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
    "UnauthorizedSSOTokenError", "TokenRetrievalError", "LocalTokenNotFoundError"})
_NO_NETWORK = frozenset({
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "ConnectionClosedError", "ProxyConnectionError", "ClientConnectorError",
    "ClientConnectionError", "ServerDisconnectedError", "ServerTimeoutError", "ConnectError",
    "ConnectTimeout", "NetworkError", "NewConnectionError", "NameResolutionError",
    "MaxRetryError", "gaierror", "OfflineModeIsEnabled", "ConnectionError", "TimeoutError"})
_DENIED = frozenset({"PermissionError", "GatedRepoError", "AccessDenied"})
DETAIL_CHARS = 160   # the backend's own words, shortened: enough to tell two causes apart


def _names(e: BaseException) -> set[str]:
    names: set[str] = set()
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        names.update(c.__name__ for c in type(e).__mro__)
        e = e.__cause__ or e.__context__
    return names


def scheme(url: str) -> str:
    """``s3``, ``hf``, ``gs``... or ``file`` for a local path."""
    head, sep, _ = str(url).partition("://")
    return head.lower() if sep else "file"


def _detail(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    text = f"{type(e).__name__}: {text}"
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS - 3] + "..."


def _credentials_advice(kind: str) -> str:
    if kind in ("s3", "s3a"):
        return ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), plus "
                "FSSPEC_S3_ENDPOINT_URL for an endpoint other than AWS")
    if kind == "hf":
        return "set HF_TOKEN to a Hugging Face token with access to the repository"
    return f"configure credentials for {kind}:// (fsspec's {kind} backend)"


def _network_advice(kind: str) -> str:
    if kind in ("s3", "s3a"):
        return ("check the network, or point FSSPEC_S3_ENDPOINT_URL (or AWS_ENDPOINT_URL) at "
                "a reachable endpoint; offline, copy the data and use a local path")
    if kind == "hf":
        return ("check the network (HF_ENDPOINT for a mirror; unset HF_HUB_OFFLINE), or "
                "download the data and use a local path")
    return "check the network and the endpoint, or copy the data and use a local path"


def _file_advice(kind: str, denied: bool) -> str:
    if kind == "file":
        return ("check its permissions, or use another path" if denied
                else "check the path")
    if kind == "hf":
        return ("check the path; a private or gated repository looks absent without a "
                "token: set HF_TOKEN to one with access")
    if kind in ("s3", "s3a"):
        return ("the credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE) lack access to it; use "
                "ones that have it" if denied else "check the bucket and key")
    return "check the URL and its access rights"


def _file_in_the_way(path: str) -> str | None:
    """The nearest ancestor of local ``path`` that exists and is not a directory."""
    parent = os.path.dirname(os.path.normpath(path))
    while parent and parent != os.path.dirname(parent):
        if os.path.exists(parent):
            return parent if not os.path.isdir(parent) else None
        parent = os.path.dirname(parent)
    return None


def translate(e: BaseException, url: str, action: str) -> Open1bDataError | None:
    """The package error for backend exception ``e`` raised while ``action``-ing ``url``
    (``read``, ``list``, ``write``, ...), or None when ``e`` is not a storage failure."""
    if isinstance(e, Open1bDataError):
        return None
    names, kind = _names(e), scheme(url)
    where = f"cannot {action} {url}"
    if names & _NO_CREDENTIALS:
        return StorageError(f"{where}: no credentials ({_detail(e)}); "
                            f"{_credentials_advice(kind)}")
    if names & _NO_NETWORK:
        why = ("offline mode is on" if "OfflineModeIsEnabled" in names
               else "no network or a wrong endpoint")
        return StorageError(f"{where}: {why} ({_detail(e)}); {_network_advice(kind)}")
    if not isinstance(e, OSError):
        if kind == "hf" and "HfHubHTTPError" in names:
            return StorageError(f"{where}: the Hub refused ({_detail(e)}); "
                                f"{_file_advice(kind, True)}")
        return None
    if isinstance(e, FileNotFoundError):
        return FileMissingError(f"{where}: it does not exist; {_file_advice(kind, False)}")
    if isinstance(e, NotADirectoryError) or e.errno == errno.ENOTDIR:
        blocker = _file_in_the_way(str(url)) if kind == "file" else None
        return FileAccessError(f"{where}: {blocker or 'a component of the path'} is a file, "
                               f"not a directory; check the path")
    if isinstance(e, FileExistsError):   # os.makedirs met a file where a directory goes
        return FileAccessError(f"{where}: {e.filename or url} is a file, a directory is "
                               f"needed there; check the path")
    if isinstance(e, IsADirectoryError):
        return FileAccessError(f"{where}: it is a directory, expected a file; name a file")
    if names & _DENIED or e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = e.strerror or "permission denied"
        return FileAccessError(f"{where}: {why.lower()}; {_file_advice(kind, True)}")
    why = e.strerror or _detail(e)
    return FileAccessError(f"{where}: {why}")


@contextlib.contextmanager
def failures(url: str, action: str) -> Iterator[None]:
    """Run one storage operation on ``url``; re-raise a backend failure as ``translate``
    names it (the original stays attached as ``__cause__`` for ``OPEN1B_DEBUG``)."""
    try:
        yield
    except Exception as e:
        err = translate(e, url, action)
        if err is None:
            raise
        raise err from e
