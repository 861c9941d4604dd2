"""The controller's own cache: small JSON documents named by the digest of what they were
computed from, so an entry can never answer for other inputs (docs/speed.md).

Location: ``$SPECULATORS_PATCH_CACHE/fast`` (default ``~/.cache/speculators-patch/fast``);
plans in ``$SPECULATORS_PATCH_PLAN_CACHE`` where that is set.
Every failure to read or write it is silent: the cache only ever saves time, the command
then computes the answer itself. Each entry has a seal beside it (the sha256 of its bytes):
an entry whose bytes differ from what was stored -- edited by hand, cut short -- is computed
afresh, never trusted. ``SPECULATORS_PATCH_NO_FAST_PATH=1`` turns off every fast
path (this cache, the patch index and the manifest's record of checked patches), which is
how the tests compare the fast answers with the full ones; ``--no-cache`` turns them off for
one command (``switched_off``), without touching the environment.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

NO_FAST_PATH = "SPECULATORS_PATCH_NO_FAST_PATH"

# ``--no-cache`` for the command that runs inside ``switched_off`` (a context variable: set and
# reset by that block alone, never assigned from another module).
_OFF: contextvars.ContextVar[bool] = contextvars.ContextVar("speculators_patch_cache_off", default=False)


def enabled() -> bool:
    """False inside ``switched_off``, or when ``$SPECULATORS_PATCH_NO_FAST_PATH`` is set to
    anything but ``""``/``0``."""
    return not _OFF.get() and os.environ.get(NO_FAST_PATH, "") in ("", "0")


def base() -> Path:
    """``$SPECULATORS_PATCH_CACHE`` (default ``~/.cache/speculators-patch``); may not exist yet."""
    return Path(os.environ.get("SPECULATORS_PATCH_CACHE") or Path.home() / ".cache" / "speculators-patch")


@contextlib.contextmanager
def switched_off(off: bool = True) -> Iterator[None]:
    """Inside the block (when ``off``), this cache and every fast path are off (``--no-cache``):
    the same switch as ``$SPECULATORS_PATCH_NO_FAST_PATH=1``, for this command alone."""
    token = _OFF.set(off)
    try:
        yield
    finally:
        _OFF.reset(token)


def directory() -> Path:
    """``$SPECULATORS_PATCH_CACHE/fast`` (default ``~/.cache/speculators-patch/fast``); may not exist yet."""
    return base() / "fast"


PLAN_CACHE = "SPECULATORS_PATCH_PLAN_CACHE"


def folder(kind: str) -> Path:
    """Where entries of ``kind`` live: ``directory()/kind``; plans (kind ``plans``) in
    ``$SPECULATORS_PATCH_PLAN_CACHE`` when it is set (the CLI and the Ansible collection
    share them)."""
    if kind == "plans" and os.environ.get(PLAN_CACHE):
        return Path(os.environ[PLAN_CACHE])
    return directory() / kind


def key(document: object) -> str:
    """sha256 (hex) of a JSON-able document, keys sorted."""
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def load(kind: str, digest: str) -> object | None:
    """The document stored under ``kind/digest``, or None (absent, unreadable, disabled, or
    its bytes not those ``store`` sealed: an entry edited by hand or cut short is never read)."""
    if not enabled():
        return None
    path = folder(kind) / f"{digest}.json"
    try:
        data = path.read_bytes()
        if path.with_suffix(".seal").read_text(encoding="ascii") != hashlib.sha256(data).hexdigest():
            return None
        return json.loads(data)
    except (OSError, ValueError):
        return None


def store(kind: str, digest: str, document: object) -> None:
    """Write ``document`` under ``kind/digest`` atomically (temporary file + rename), then its
    seal (the sha256 of those bytes, ``kind/digest.seal``) that ``load`` checks; never raises."""
    if not enabled():
        return
    try:
        data = json.dumps(document).encode()
    except (TypeError, ValueError):
        return
    path = folder(kind) / f"{digest}.json"
    _write(path, data)
    _write(path.with_suffix(".seal"), hashlib.sha256(data).hexdigest().encode())


def _write(path: Path, data: bytes) -> None:
    """``data`` to ``path`` atomically (temporary file + rename), folders made; never raises."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


@contextlib.contextmanager
def locked(kind: str, digest: str) -> Iterator[None]:
    """Hold an exclusive POSIX record lock for ``kind/digest`` (one of 256 lock files per
    kind, chosen by the digest's first two hex digits), so that of several processes wanting
    the same entry the first computes it and the others wait, then read it. Without a
    writable cache, or with the fast paths off, nothing is locked."""
    import fcntl

    handle = None
    if enabled():
        try:
            locks = folder(kind) / "locks"
            locks.mkdir(parents=True, exist_ok=True)
            handle = open(locks / f"{digest[:2]}.lock", "a")
            fcntl.lockf(handle, fcntl.LOCK_EX)
        except OSError:
            if handle is not None:
                handle.close()
            handle = None
    try:
        yield
    finally:
        if handle is not None:
            handle.close()  # closing the file releases the lock


def load_blob(digest: str) -> bytes | None:
    """Bytes stored by ``store_blob`` whose sha256 is ``digest``, or None (absent,
    unreadable, disabled, or not matching the digest: never other bytes)."""
    if not enabled():
        return None
    try:
        data = (directory() / "blobs" / digest[:2] / digest).read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == digest else None


def store_blob(data: bytes) -> str:
    """Keep ``data`` under its sha256 (hex, returned), atomically, once; never raises."""
    digest = hashlib.sha256(data).hexdigest()
    path = directory() / "blobs" / digest[:2] / digest
    try:
        kept = path.exists()  # EACCES (a cache folder of another user) is raised, not False
    except OSError:
        return digest
    if enabled() and not kept:
        _write(path, data)
    return digest
