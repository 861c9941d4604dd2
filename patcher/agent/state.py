"""The state this tool keeps next to an install, read and checked.

In ``<site-packages>/.speculators-patch/``:
  manifest.json      what was patched: per file the pristine and patched sha256
  pristine/<path>.sha256-<hex>
                     byte-exact originals, named by their digest (verified before use)
  journal.json       present only while a commit is running: roll back on recovery
  cleanup.json       the same record once committed: roll forward (deletions only)
  lock               a POSIX ``fcntl.lockf`` record lock held by the writing process
"""

from __future__ import annotations

import collections
import json
import os

from .common import (
    JOURNAL,
    MANIFEST,
    OLD,
    REPAIR_HINT,
    STATE_DIR,
    TMP,
    AgentError,
    check_relative,
    digest_of,
    read_bytes,
    sha256,
    way,
)
from .manifest_rules import manifest_problem  # noqa: F401 (commit imports it from here)


def state_paths(manifest, backups):
    """The speculators paths the state names: manifest entries and kept copies (valid
    paths only; a malformed manifest is reported by ``load_state``)."""
    named = set(backups)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if isinstance(files, dict):
        named |= set(files)
    out = set()
    for path in named:
        try:
            out.add(check_relative(path))
        except AgentError:
            pass
    return out


def backup_name(path, digest):
    return "%s.sha256-%s" % (path, digest)


def find_backup(state, path, digest):
    """The kept pristine copy of ``path`` whose bytes have ``digest`` (verified), or None.
    Also accepts the layout of earlier versions (``pristine/<path>``)."""
    for name in (backup_name(path, digest), path):
        data = read_bytes(os.path.join(state, "pristine", name))
        if data is not None and sha256(data) == digest:
            return name, data
    return None


def list_backups(state):
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


def mismatched_backups(state):
    """The names under ``pristine/`` (sorted) whose bytes do not have the digest their name
    carries: no verified copy (``load_state`` leaves them out), so nothing restores from them;
    ``repair``'s commit removes them (no record needs them) and says so."""
    out = []
    for name, (_, named) in sorted(list_backups(state).items()):
        if named is not None:
            data = read_bytes(os.path.join(state, "pristine", name))
            if data is None or sha256(data) != named:
                out.append(name)
    return out


State = collections.namedtuple("State", "manifest manifest_sha256 pristine backups problem")
State.__doc__ = """The state directory as ``load_state`` read it: the manifest (or None), its sha256 (or
None), ``pristine`` {path: verified pristine bytes}, ``backups`` {path: [verified bytes of every
kept copy]}, and ``problem``: None, or one line naming the file at fault and the documented way
out (then the manifest and pristine copies are what could be read before it)."""


def _wrong_record(state, path, entry):
    """The problem line for a record whose ``pristine_sha256`` names no kept copy of ``path``
    while an intact one (its bytes match the digest in its name) is kept: the record is at
    fault, not the copy."""
    names = sorted(n for n, (p, d) in list_backups(state).items() if p == path and d)
    return (
        "%s records pristine_sha256 %s... for %s, but the copy kept for it (pristine/%s) is intact (its bytes "
        "match the digest in its name): the record is wrong (edited?), not the copy; nothing was restored; %s"
        % (os.path.join(state, MANIFEST), entry["pristine_sha256"][:12], path, names[0] if names else path, REPAIR_HINT)
    )


def load_state(state, root):
    """Read and validate the state as a whole: a ``State``."""
    mpath = os.path.join(state, MANIFEST)
    raw = read_bytes(mpath)
    digest = None if raw is None else sha256(raw)
    manifest, pristine, backups = None, {}, {}
    for name, (path, named) in sorted(list_backups(state).items()):
        data = read_bytes(os.path.join(state, "pristine", name))
        if data is not None and (named is None or sha256(data) == named):
            backups.setdefault(path, []).append(data)
    if os.path.exists(os.path.join(state, JOURNAL)):  # (a cleanup record alone: the commit is done)
        return State(
            None,
            digest,
            {},
            backups,
            "%s: an interrupted commit is still recorded and could not be finished; "
            "run any command again with write access, or %s" % (os.path.join(state, JOURNAL), REPAIR_HINT),
        )
    if raw is not None:
        try:
            manifest = json.loads(raw.decode("utf-8"))
        except ValueError:
            return State(None, digest, {}, backups, "%s is damaged (not valid JSON); %s" % (mpath, REPAIR_HINT))
        why = manifest_problem(manifest)
        if why:
            return State(None, digest, {}, backups, "%s is damaged (%s); %s" % (mpath, why, REPAIR_HINT))
    entries = (manifest or {}).get("files", {})
    for path in sorted(entries):
        entry = entries[path]
        hit = find_backup(state, path, entry["pristine_sha256"])
        if hit is None and backups.get(path):  # an intact copy is kept: the record's digest is what is wrong
            return State(manifest, digest, pristine, backups, _wrong_record(state, path, entry))
        if hit is None:
            current = digest_of(os.path.join(root, path))
            if current == entry["pristine_sha256"]:
                fix = REPAIR_HINT + " (the installed file is the pristine one)"
            else:
                fix = (
                    "reinstall speculators (pip install --force-reinstall --no-deps speculators==%s), then run "
                    "`%s`" % ((manifest or {}).get("speculators_version") or "<version>", way("repair"))
                )
            return State(
                manifest,
                digest,
                pristine,
                backups,
                (
                    "%s: the pristine copy of %s is missing or does not match its recorded sha256 (tampered or "
                    "truncated); nothing was restored from it; %s" % (os.path.join(state, "pristine"), path, fix)
                ),
            )
        pristine[path] = hit[1]
    for path, copies in sorted(backups.items()):
        if path in entries:
            continue
        current = read_bytes(os.path.join(root, path))
        if current is not None and any(current != c for c in copies):
            return State(
                manifest,
                digest,
                pristine,
                backups,
                (
                    "%s: %s has a kept pristine copy that differs from the installed file but no record in %s "
                    "(deleted or emptied?); %s" % (state, path, MANIFEST, REPAIR_HINT)
                ),
            )
    return State(manifest, digest, pristine, backups, None)


def orphaned_state(site_dir):
    """What to add to "no speculators installed in SITE_DIR": "" when ``site_dir`` holds no
    state of this tool, else one clause naming it, what it recorded (the speculators release,
    the number of files) and the way out (``repair`` removes it). Raises nothing."""
    state = os.path.join(site_dir, STATE_DIR)
    if not os.path.isdir(state):
        return ""
    try:
        manifest = json.loads((read_bytes(os.path.join(state, MANIFEST)) or b"null").decode("utf-8"))
    except ValueError:
        manifest = None
    manifest = manifest if isinstance(manifest, dict) else {}
    files = manifest.get("files") if isinstance(manifest.get("files"), dict) else {}
    release = manifest.get("speculators_version")
    what = "its record of %d patched file(s) of speculators %s and their pristine copies" % (
        len(files),
        release if isinstance(release, str) else "(unknown release)",
    )
    return (
        "; %s is left over from patching it (%s), and speculators was uninstalled since: nothing there is "
        "needed; `%s` removes it" % (state, what if files else "no record", way("repair"))
    )
