"""The commit protocol: a patch set written all-or-nothing, and ``repair``.

Under the lock, every file and the manifest are checked to be what the controller read
(``changed-since-read`` otherwise); a journal makes an interrupted commit roll back on the
next run, and a cleanup record lets a finished one roll forward. Each write is a numbered
step, so the fault-injection tests can stop the agent at every one of them. The protocol
and the reasons for it are in docs/design.md ("Commit protocol").
"""

from __future__ import annotations

import base64
import errno
import fcntl
import json
import os
import signal
import socket
import stat
import sys
import time

from .common import (
    CLEANUP,
    HEX_DIGEST,
    JOURNAL,
    LOCK_WAIT_SECONDS,
    MANIFEST,
    NOTICE_PREFIX,
    OLD,
    REPAIR_HINT,
    SPACE_MARGIN,
    STATE_DIR,
    TMP,
    AgentError,
    check_relative,
    digest_of,
    dist_infos,
    package_root,
    read_bytes,
    record_digests,
    sha256,
    site_dir_of,
    way,
)
from .state import backup_name, find_backup, list_backups, load_state, manifest_problem


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
    """An exclusive POSIX record lock (``fcntl.lockf``) on ``<state>/lock``. Record locks
    work on NFS (through lockd), where ``flock`` may not.

    ``request`` (the agent's request, optional) bounds the wait: ``lock_wait`` seconds (the
    controller sends what its ``--timeout`` leaves; at most, and by default,
    LOCK_WAIT_SECONDS), and names what holds it: ``verb``. The holder writes who it is
    (pid, host, verb, since when) into the lock file once it has the lock; a waiter says
    who holds it on stderr within a second (``_say``); the holder empties the file as it
    lets go. A waiter gives up -- having written nothing -- at the deadline or as soon as
    the command that started it has ended (its parent process changed: the controller gave
    up or was killed).
    Raises AgentError when the lock cannot be had (no write access, ENOLCK, timeout)."""

    def __init__(self, state, env=None, request=None):
        self.path = os.path.join(state, "lock")
        self.env = env
        request = request or {}
        wait = request.get("lock_wait")
        self.bounded = isinstance(wait, (int, float))  # by the caller's --timeout
        self.wait = max(0.0, min(wait, LOCK_WAIT_SECONDS)) if self.bounded else LOCK_WAIT_SECONDS
        self.verb = str(request.get("verb") or request.get("op") or "a command")

    def _open(self):
        created = not os.path.exists(self.path)
        try:
            if self.env is not None and not os.path.isdir(os.path.dirname(self.path)):
                self.env.makedirs(os.path.dirname(self.path))  # removed by a full revert meanwhile
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if created and self.env is not None:
                self.env.own(self.path)
        except OSError as e:  # e.g. a read-only file system
            raise AgentError(
                "cannot write to %s: %s (nothing changed)" % (os.path.dirname(self.path), e.strerror)
            ) from None

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
        parent = os.getppid()
        start = time.monotonic()
        deadline = start + self.wait
        told = False
        while True:
            try:
                if os.environ.get("SPECULATORS_PATCH_FAULT") == "enolck":
                    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not self._same_file():
                    os.close(self.fd)
                    self._open()
                    continue
                if os.getppid() != parent:  # the caller gave up on us while we waited
                    os.close(self.fd)
                    raise AgentError(_GONE % self.path)
                self._record()
                return self
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    os.close(self.fd)
                    if e.errno == errno.ENOLCK:
                        raise AgentError(
                            "cannot lock %s: the file system does not support locks (ENOLCK; an NFS mount "
                            "with 'nolock' or no lockd?); nothing changed; mount it with locking, or run "
                            "the tool on the machine that exports it" % self.path
                        ) from None
                    raise AgentError("cannot lock %s: %s (nothing changed)" % (self.path, e.strerror)) from None
                now = time.monotonic()
                if now > deadline:
                    holder = _holder(self.fd)
                    os.close(self.fd)
                    raise AgentError(
                        "%s is held by %s; gave up after %s s waiting for it%s; nothing changed"
                        % (self.path, holder, _seconds(self.wait), " (--timeout)" if self.bounded else "")
                    ) from None
                if os.getppid() != parent:
                    os.close(self.fd)
                    raise AgentError(_GONE % self.path) from None
                if not told and now - start >= 0.25:
                    told = True
                    _say(
                        "waiting for the lock on %s: held by %s; giving up in %s s"
                        % (self.path, _holder(self.fd), _seconds(max(0.0, deadline - now)))
                    )
                time.sleep(0.05)

    def _record(self):
        """Say in the lock file who holds it (read by ``_holder``); a failure to say is no failure."""
        try:
            data = json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "verb": self.verb, "since": time.time()}
            ).encode()
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, data, 0)
        except (OSError, AttributeError):
            pass

    def __exit__(self, *exc):
        try:
            os.ftruncate(self.fd, 0)  # the lock file says who holds it only while someone does
        except OSError:
            pass
        os.close(self.fd)  # closing the descriptor releases the record lock


_GONE = "the command that started this agent ended while it waited for %s; nothing changed"


def _seconds(s):
    return ("%.1f" % s).rstrip("0").rstrip(".")


def _say(line):
    """One line for the user while a command waits (the controller prints it on stderr)."""
    try:
        sys.stderr.write(NOTICE_PREFIX + line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _holder(fd):
    """Who holds the lock on ``fd``, in words: what the holder wrote into the lock file
    (pid, verb, since when), when that process still runs and is the one the kernel names;
    else the pid the kernel names (Linux: /proc/locks) and its command; else that it did
    not say."""
    kernel = _kernel_holder(fd)
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        pid, since = int(record["pid"]), float(record["since"])
        here = record.get("host") == socket.gethostname()
        if not here or (_alive(pid) and kernel in (None, pid)):
            return "pid %d%s (speculators-patch %s, since %s UTC, %s s ago)" % (
                pid,
                "" if here else " on " + str(record.get("host")),
                record.get("verb"),
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(since)),
                _seconds(max(0.0, time.time() - since)),
            )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    if kernel is not None:
        return "pid %d (%s), another program" % (kernel, _command_of(kernel))
    return "another process (it did not say which)"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _kernel_holder(fd):
    """The pid holding a POSIX lock on ``fd``'s file, from /proc/locks (Linux), or None."""
    try:
        st = os.fstat(fd)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if "->" in parts or len(parts) < 6 or parts[1] != "POSIX":
            continue
        try:
            pid, ident = int(parts[4]), parts[5].split(":")
            if int(ident[-1]) == st.st_ino and pid != os.getpid():
                return pid
        except (ValueError, IndexError):
            continue
    return None


def _command_of(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return "command unknown"
    text = " ".join(" ".join(w.decode("utf-8", "replace").split()) for w in words if w)  # one line
    return text[:80] + ("..." if len(text) > 80 else "")


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
                view = view[os.write(fd, view) :]
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
        _replace(_write_tmp(old, read_bytes(target), like=os.stat(target)), old)


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


def _load_journal(path):
    """A journal or cleanup record, validated. Raises AgentError naming the file."""
    raw = read_bytes(path)
    try:
        journal = json.loads(raw.decode("utf-8"))
        files = journal["files"]
        assert isinstance(journal["root"], str) and isinstance(files, dict)
        for p, e in files.items():
            check_relative(p, "journal path")
            assert HEX_DIGEST.match(e["old"]) and HEX_DIGEST.match(e["new"])
        for key in ("manifest_old", "manifest_new"):
            assert journal[key] is None or HEX_DIGEST.match(journal[key])
        for name in journal["new_backups"] + journal["drop"]:
            check_relative(name.partition(".sha256-")[0], "journal backup")
    except AgentError as e:
        raise AgentError(
            "%s is damaged (%s): the interrupted commit was not touched; %s" % (path, e, REPAIR_HINT)
        ) from None
    except (ValueError, KeyError, TypeError, AssertionError, AttributeError):
        raise AgentError(
            "%s is damaged (not a journal this tool wrote): the interrupted commit was not touched; %s"
            % (path, REPAIR_HINT)
        ) from None
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
    for dirpath, _dirs, _names in sorted(os.walk(top), key=lambda x: -len(x[0])):
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
            raise AgentError(
                "%s records a commit under %s but speculators is now at %s: not rolling it back over "
                "another install; %s" % (jpath, jroot, root, REPAIR_HINT)
            )
        # ``repair``: the environment was moved or copied with its state; the journal's
        # paths are relative, and every file is checked against its digests before any
        # rename, so it is salvaged here, never under the old location.
        jroot = root
    actions = []
    entries = list(journal["files"].items())
    entries.append((None, {"old": journal["manifest_old"], "new": journal["manifest_new"]}))
    for path, e in entries:
        target = os.path.join(state, MANIFEST) if path is None else os.path.join(jroot, path)
        current = digest_of(target)
        if current == e["old"]:
            continue
        if current == e["new"]:
            if e["old"] is None:
                actions.append(("unlink", target))
                continue
            if digest_of(target + OLD) == e["old"]:
                actions.append(("restore", target))
                continue
            why = "its content from before that commit (%s) is missing or damaged" % (target + OLD)
        else:
            why = (
                "%s is neither what it was before that commit nor what the commit was writing "
                "(speculators reinstalled or the file edited since?)" % target
            )
        if not salvage:
            raise AgentError(
                "%s: an interrupted commit cannot be rolled back: %s; nothing changed; %s"
                % (jpath, why, REPAIR_HINT + ", keeping the files as they are")
            )
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
    raw = read_bytes(os.path.join(state, MANIFEST))
    try:
        files = json.loads(raw.decode("utf-8"))["files"]
        return {backup_name(p, e["pristine_sha256"]) for p, e in files.items()}
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


def heal(state, root, request=None):
    """Before reading, finish or roll back a command that died mid-way (``kill -9``, power
    loss, a full disk), so every subcommand sees the install whole. Waits for a commit in
    progress (the lock, as long as ``request``'s ``lock_wait`` allows: ``_Lock``). Returns
    (rolled back?, problem or None); the problem is one line (e.g. a read-only install, a
    lock held past the wait, or files that are no longer what the journal expects)."""
    if not (
        os.path.exists(os.path.join(state, JOURNAL))
        or os.path.exists(os.path.join(state, CLEANUP))
        or _has_litter(state)
    ):
        return False, None, None
    try:
        with _Lock(state, _Env(os.path.dirname(state)), request):
            done = _recover(state, root)
            _sweep(state)
            return done, None, None
    except AgentError as e:
        return False, str(e), None
    except OSError as e:
        if not os.path.exists(os.path.join(state, JOURNAL)) and os.path.exists(os.path.join(state, CLEANUP)):
            # committed: only deletions are left, and the install reads whole without them
            return False, None, _unfinished(state, e)
        return (
            False,
            (
                "%s: an interrupted commit could not be finished (%s: %s); fix that and run any command "
                "again: it is finished first" % (os.path.join(state, JOURNAL), e.filename or state, e.strerror)
            ),
            None,
        )


def _unfinished(state, e):
    """One line: a finished commit's cleanup stopped at ``e`` (an OSError), and the command that recovers."""
    path = getattr(e, "filename", None) or state
    if os.path.realpath(path) == os.path.realpath(state):  # the last step of a full revert: only an empty directory
        return "%s: the files are whole, but this empty state directory could not be removed (%s); `rmdir %s`" % (
            state,
            getattr(e, "strerror", None) or e,
            state,
        )
    fix = (
        "`chattr -i %s`" % path if _immutable(path) or _immutable(os.path.dirname(path)) else "make %s removable" % path
    )
    return (
        "%s: a finished commit's cleanup could not remove %s (%s); the files are whole; %s, then run "
        "`%s`: it finishes the cleanup"
        % (os.path.join(state, CLEANUP), path, getattr(e, "strerror", None) or e, fix, way("status"))
    )


def _preflight(root, state, datas, backups, small, drops=()):
    """Before the first write: every directory writable, no target immutable, every kept
    copy the commit drops (``drops``, names under ``pristine/``) and the manifest removable or
    replaceable, and room on each file system for everything the commit writes (old contents
    stay as hard links until the commit point, so a rollback needs no space). Raises
    AgentError naming the one command that clears it."""
    need = {}

    def add(d, n):
        dev = os.stat(d).st_dev
        blocks = (n // 4096 + 2) * 4096
        need[dev] = (need.get(dev, (d, 0))[0], need.get(dev, (d, 0))[1] + blocks)

    for path, data in datas.items():
        add(os.path.dirname(os.path.join(root, path)), len(data))
    for data in backups.values():
        add(state, len(data))
    add(state, small)
    dirs = sorted({os.path.dirname(os.path.join(root, p)) for p in datas} | {state, os.path.join(state, "pristine")})
    for d in dirs:
        if os.path.isdir(d) and _immutable(d):
            raise AgentError(
                "cannot write to %s: the directory is immutable or append-only (chattr +i/+a; nothing "
                "changed); `chattr -i %s`, then run the command again" % (d, d)
            )
        if os.path.isdir(d) and not os.access(d, os.W_OK):
            raise AgentError("cannot write to %s: permission denied (nothing changed)" % d)
    for path in datas:
        if _immutable(os.path.join(root, path)):
            raise AgentError(
                "cannot replace %s: it is immutable or append-only (chattr +i/+a; nothing changed)"
                % os.path.join(root, path)
            )
    mpath = os.path.join(state, MANIFEST)
    for path in [mpath] + [os.path.join(state, "pristine", name) for name in drops]:
        if not os.path.lexists(path):
            continue
        for where in (path, os.path.dirname(path)):
            if _immutable(where):
                raise AgentError(
                    "cannot remove %s: it is immutable or append-only (chattr +i/+a), and this commit "
                    "must replace or drop it; nothing changed; `chattr -i %s`, then run the command "
                    "again" % (path, where)
                )
        if not os.access(os.path.dirname(path), os.W_OK):
            raise AgentError("cannot write to %s: permission denied (nothing changed)" % os.path.dirname(path))
    for d, n in need.values():
        if os.environ.get("SPECULATORS_PATCH_SKIP_SPACE_CHECK"):  # tests: reach a real ENOSPC mid-commit
            break
        sv = os.statvfs(d)
        free = sv.f_bavail * sv.f_frsize
        if free < n + SPACE_MARGIN:
            raise AgentError(
                "not enough space on the file system of %s: the commit needs %d KiB, %d KiB are free "
                "(nothing changed)" % (d, (n + SPACE_MARGIN) // 1024, free // 1024)
            )


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
    Returns {"written": [paths], "recovered": bool}, and "unfinished": one line when the commit
    is done but its cleanup (deletions only) stopped, naming the command that recovers.
    Raises AgentError("changed-since-read: ...") when a file or the manifest is not what the
    caller read (nothing is written; read again), and AgentError for anything else that
    stops it (nothing changed: a failure after the first write is rolled back).
    """
    state, root = request["state_dir"], request["root"]
    # All data is in hand: finish even if the SSH session that sent it drops now, or, once
    # the lock is held, the user presses Ctrl-C (the terminal sends SIGINT to a local agent
    # too; SIGTERM to the whole group alike): the caller then waits for, and reports, this
    # commit's outcome. A Ctrl-C while it still waits for the lock stops it there, having
    # written nothing.
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    writes, keep, repair = request.get("writes") or {}, request.get("pristine") or {}, bool(request.get("repair"))
    for path in list(writes) + list(keep):
        check_relative(path)
    if request.get("manifest") is not None and manifest_problem(request["manifest"]):
        raise AgentError("refusing a malformed manifest: %s" % manifest_problem(request["manifest"]))
    try:
        env = _Env(os.path.dirname(state))
        made = env.makedirs(os.path.join(state, "pristine"))
    except OSError as e:
        raise AgentError("cannot write to %s: %s (nothing changed)" % (os.path.dirname(state), e.strerror)) from None
    lock, locker = None, _Lock(state, env, request)
    try:
        lock = locker.__enter__()
        for name in ("SIGINT", "SIGTERM"):  # a kill of the whole process group too: finish, then answer
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
    except (AgentError, KeyboardInterrupt) as e:
        if lock is not None:
            lock.__exit__()
        for d in reversed(made):  # leave no empty state directory behind
            for n in os.listdir(d):
                os.unlink(os.path.join(d, n))
            os.rmdir(d)
        if isinstance(e, KeyboardInterrupt):
            held = _holder(locker.fd) if lock is None and hasattr(locker, "fd") else None
            raise AgentError(
                "it was still waiting for the lock on %s%s" % (locker.path, ", held by " + held if held else "")
            ) from None
        raise
    try:
        return _commit_locked(state, root, writes, keep, request, env, repair)
    except BaseException:
        _tidy_refused(state)
        raise
    finally:
        lock.__exit__()


def _tidy_refused(state):
    """After a refused or rolled-back commit, under the lock: a state directory that records
    nothing (no manifest, no copy, no journal: the first apply's, made for this commit) goes,
    lock included, so a refusal leaves the install as pip left it."""
    if any(os.path.exists(os.path.join(state, n)) for n in (MANIFEST, JOURNAL, CLEANUP)) or list_backups(state):
        return
    try:
        _remove_empty_state(state)
    except OSError:
        pass  # what is left records nothing; the next command that writes takes it over


def _commit_locked(state, root, writes, keep, request, env, repair):
    """``commit`` once the lock is held: every check against what the caller read, then the
    journaled writes, the commit point and the cleanup (docs/design.md, "Commit protocol")."""
    recovered = _recover_first(state, root, repair)
    _sweep(state)
    mpath = os.path.join(state, MANIFEST)
    m_raw = read_bytes(mpath)
    m_sha = None if m_raw is None else sha256(m_raw)
    if "manifest_expect_sha256" in request and request["manifest_expect_sha256"] != m_sha:
        raise AgentError("changed-since-read: %s" % mpath)
    if not repair:
        problem = load_state(state, root).problem
        if problem:
            raise AgentError(problem)
    datas = _new_contents(root, writes)
    to_back = _copies_to_store(state, keep)
    manifest = request.get("manifest")
    m_new = None if manifest is None else json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    drop = _copies_to_drop(state, manifest, to_back)
    _refuse_losing_copies(state, root, drop, datas, manifest, m_raw, set(request.get("adopted") or ()))
    journal = {
        "root": root,
        "files": {p: {"old": writes[p]["expect_sha256"], "new": sha256(d)} for p, d in datas.items()},
        "manifest_old": m_sha,
        "manifest_new": None if m_new is None else sha256(m_new),
        "new_backups": sorted(to_back),
        "drop": drop,
    }
    j_raw = json.dumps(journal).encode("utf-8")
    _preflight(root, state, datas, to_back, len(j_raw) + len(m_new or b"") + (len(m_raw or b"") if m_new else 0), drop)

    jpath, cpath = os.path.join(state, JOURNAL), os.path.join(state, CLEANUP)
    try:
        _write_journaled(state, root, env, j_raw, to_back, datas, m_raw, m_new)
        _replace(jpath, cpath)  # the commit point: from here on the next command rolls forward
    except BaseException as e:
        _roll_back_failed_write(state, root, e)
        if isinstance(e, OSError):
            raise AgentError("cannot write %s: %s (nothing changed)" % (e.filename or state, e.strerror)) from None
        raise
    answer = {"written": sorted(datas), "recovered": recovered}
    try:
        _fsync_dir(state)
        _finish(state, journal, cpath)
    except OSError as e:  # committed: the files are whole; what is left is deleted once this is fixed
        answer["unfinished"] = _unfinished(state, e)
    return answer


def _recover_first(state, root, repair):
    """Finish or roll back what an interrupted command left, before this commit reads
    anything. Returns whether something was rolled back (allowed only with ``repair``: else
    the caller read the half-written files, and its plan is stale)."""
    try:
        recovered = _recover(state, root, salvage=repair)
    except OSError as e:
        if os.path.exists(os.path.join(state, JOURNAL)):
            raise
        raise AgentError(_unfinished(state, e) + " (nothing changed)") from None
    if recovered and not repair:  # the caller read the half-written files: its plan is stale
        raise AgentError("changed-since-read: an interrupted commit was rolled back first")
    return recovered


def _new_contents(root, writes):
    """{path: new bytes} of the request's writes, each checked: whole after its transit
    (its ``sha256``), and written over the file the caller read (``expect_sha256``)."""
    datas = {}
    for path, w in sorted(writes.items()):
        data = base64.b64decode(w["data"])
        if "sha256" in w and sha256(data) != w["sha256"]:
            raise AgentError("the commit request for %s was damaged in transit (nothing changed)" % path)
        if digest_of(os.path.join(root, path)) != w["expect_sha256"]:
            raise AgentError("changed-since-read: %s" % path)
        datas[path] = data
    return datas


def _copies_to_store(state, keep):
    """{backup name: bytes} of the pristine copies the request brings that ``pristine/``
    does not hold yet (verified by digest)."""
    to_back = {}
    for path, b64 in sorted(keep.items()):
        data = base64.b64decode(b64)
        name = backup_name(path, sha256(data))
        if digest_of(os.path.join(state, "pristine", name)) != sha256(data):
            to_back[name] = data
    return to_back


def _copies_to_drop(state, manifest, to_back):
    """The kept copies (backup names, sorted) that no file of the new ``manifest`` needs.
    Raises AgentError when a file it records has no verified copy, kept or stored now."""
    needed = set()
    for path, entry in sorted((manifest or {}).get("files", {}).items()):
        name = backup_name(path, entry["pristine_sha256"])
        hit = find_backup(state, path, entry["pristine_sha256"])
        if name not in to_back and hit is None:
            raise AgentError("%s: no verified pristine copy of %s to keep (nothing changed)" % (state, path))
        needed.add(name if name in to_back else hit[0])
    return sorted(n for n in list_backups(state) if n not in needed)


def _write_journaled(state, root, env, j_raw, to_back, datas, m_raw, m_new):
    """Every write of a commit, in order, up to the commit point (which the caller takes):
    the journal, the new pristine copies, the files, the manifest (docs/design.md, "Commit
    protocol", steps 4-6)."""
    jpath, mpath = os.path.join(state, JOURNAL), os.path.join(state, MANIFEST)
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


def _roll_back_failed_write(state, root, error):
    """After ``error`` stopped a commit before its commit point: roll back what it wrote.
    Raises AgentError when the rollback stops too (the journal is kept for the next command)."""
    try:
        if os.path.exists(os.path.join(state, JOURNAL)):
            _recover(state, root)
        _sweep(state)
    except (OSError, AgentError) as again:
        raise AgentError(
            "cannot write %s: %s; the rollback stopped too (%s): the journal is kept and the next "
            "command rolls it back once that is fixed"
            % (
                getattr(error, "filename", None) or state,
                getattr(error, "strerror", None) or error,
                getattr(again, "strerror", None) or again,
            )
        ) from None


def _copy_path(name):
    """The speculators path a kept copy (``pristine/<name>``) is a copy of."""
    return name.partition(".sha256-")[0]


def _installed_version(state):
    """speculators' version from the dist-info next to the state directory, or None."""
    found = dist_infos("speculators", [os.path.dirname(state)])
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
    dist = dist_infos("speculators", [os.path.dirname(state)])
    for name in list(drop):
        path = _copy_path(name)
        if path in kept:
            continue
        named = name.partition(".sha256-")[2]
        if named and digest_of(os.path.join(state, "pristine", name)) != named:
            continue  # not the bytes its name says: it restores nothing, so it may go
        after = datas[path] if path in datas else read_bytes(os.path.join(root, path))
        if after is None:  # the file is gone: its copy stays, it may be all that is left of it
            drop.remove(name)
            continue
        copy = read_bytes(os.path.join(state, "pristine", name))
        if copy is None or after == copy:
            continue
        if record_digests(dist[0][0] if dist else None, {path}).get(path) == sha256(after):
            continue
        raise AgentError(
            "refusing to drop the kept pristine copy of %s: the file differs from it and the new "
            "record keeps no entry for it, so nothing could restore it (nothing changed); "
            "run `%s` on the target and report this" % (path, way("status"))
        )


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
    _step("rmdir " + state)
    os.rmdir(state)  # a failure is the commit's ``unfinished`` line: an empty directory is left


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
        with _Lock(state, _Env(os.path.dirname(state)), request):
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
        raise AgentError("cannot repair %s: %s: %s" % (state, e.filename or state, e.strerror)) from None


def forget(request):
    """Under the lock: remove the state this tool left in a site-packages from which
    speculators was uninstalled since (``state.orphaned_state``): its manifest, pristine
    copies, any record of a commit and the lock. Nothing of speculators is left for them to
    restore or describe. Changes nothing while speculators is installed.

    request: {"site_packages": str|None}. Returns {"removed": the state directory or None}.
    Raises AgentError when it cannot be removed (one line, the way out)."""
    site_dir = site_dir_of(request)
    state = os.path.join(site_dir, STATE_DIR)
    if package_root("speculators") is not None or not os.path.isdir(state):
        return {"removed": None}
    try:
        with _Lock(state, None, request):
            if package_root("speculators") is not None:  # reinstalled while we waited
                return {"removed": None}
            for dirpath, dirs, names in os.walk(state, topdown=False):
                for n in names:
                    if os.path.join(dirpath, n) != os.path.join(state, "lock"):
                        _unlink(os.path.join(dirpath, n))
                for d in dirs:
                    os.rmdir(os.path.join(dirpath, d))
            _unlink(os.path.join(state, "lock"))
            os.rmdir(state)
    except OSError as e:
        raise AgentError(
            "cannot remove %s: %s: %s; nothing of speculators needs it: remove it by hand (rm -r %s)"
            % (state, e.filename or state, e.strerror, state)
        ) from None
    return {"removed": state}
