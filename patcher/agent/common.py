"""What every part of the agent uses: paths, digests, the installed packages, and the one
error type it answers with (``AgentError``, one line)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import site
import sys
import sysconfig

from .manifest_rules import HEX_DIGEST, REPAIR_HINT, is_speculators_path  # noqa: F401 (re-exported)

STATE_DIR = ".speculators-patch"


LOCK_WAIT_SECONDS = 120.0


# A line the agent writes on stderr with this prefix is for the user now (a wait for the lock):
# the controller prints it as it arrives (``patcher.connect.transport``).
NOTICE_PREFIX = "[speculators-patch] "


TMP = ".speculators-patch.tmp"  # a file being written; never outlives a command


OLD = ".speculators-patch.old"  # a hard link to a file's previous content while a commit runs


JOURNAL = "journal.json"


CLEANUP = "cleanup.json"


MANIFEST = "manifest.json"


def way(verb):
    """``speculators-patch VERB`` as a token in a message (``patcher.ways.Way``'s): the
    controller words it with its run's target options, which the agent never learns."""
    return "\u27e6speculators-patch %s\u27e7" % verb


SPACE_MARGIN = 64 * 1024


class AgentError(Exception):
    """A failure to report to the user as one line (the install is left unchanged)."""


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def to_b64(data):
    return None if data is None else base64.b64encode(data).decode("ascii")


def content_or_digest(data, have):
    """A file's bytes in an answer: base64, or ``{"sha256": hex}`` when the caller said it
    already holds bytes with that digest (``have``: a set of sha256 hex digests)."""
    if data is not None and have:
        digest = hashlib.sha256(data).hexdigest()
        if digest in have:
            return {"sha256": digest}
    return to_b64(data)


def read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def digest_of(path):
    data = read_bytes(path)
    return None if data is None else sha256(data)


def package_root(name):
    """Directory that holds package ``name`` (its import root), found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))


def dist_infos(name, search_dirs):
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
                meta = read_bytes(os.path.join(d, entry, "METADATA")) or b""
            except OSError:
                meta = b""
            for line in meta.decode("utf-8", "replace").splitlines():
                if line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip() or None
                    break
            found.append((os.path.join(d, entry), version))
    return found


def dist_metadata(name, search_dirs):
    """{"version", "local", "requires", "dist_info"} of distribution ``name``, read from its
    first dist-info's METADATA (``Version`` and each ``Requires-Dist`` line, as written);
    None when it is not installed. Nothing is imported."""
    found = dist_infos(name, search_dirs)
    if not found:
        return None
    dist_dir, version = found[0]
    meta = (read_bytes(os.path.join(dist_dir, "METADATA")) or b"").decode("utf-8", "replace")
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    return {"version": version, "requires": requires, "dist_info": dist_dir}


def record_digests(dist_info, paths):
    """sha256 (hex) of ``paths`` as pip installed them, from the dist-info's RECORD."""
    raw = read_bytes(os.path.join(dist_info, "RECORD")) if dist_info else None
    found = {}
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[0] in paths and parts[1].startswith("sha256="):
            b64 = parts[1][len("sha256=") :]
            try:
                found[parts[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
            except (ValueError, TypeError):
                pass
    return found


def editable_source(dist_info):
    """The project directory of an editable install (PEP 610 direct_url.json), or None."""
    raw = read_bytes(os.path.join(dist_info, "direct_url.json"))
    if not raw:
        return None
    try:
        info = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(info, dict) or not isinstance(info.get("dir_info"), dict) or not info["dir_info"].get("editable"):
        return None
    url = str(info.get("url", ""))
    return url[len("file://") :] if url.startswith("file://") else url


def not_a_directory(path):
    """Why ``path`` is not a directory, in a few words: ``a file, not a directory``, ``no
    such directory``, or ``not a directory`` (a socket, a device); None when it is one."""
    if os.path.isdir(path):
        return None
    if os.path.isfile(path):
        return "a file, not a directory"
    return "not a directory" if os.path.lexists(path) else "no such directory"


def site_dir_of(request):
    """The target's site-packages; a bare directory target is added to sys.path first."""
    if not request.get("site_packages"):
        return sysconfig.get_paths()["purelib"]
    site_dir = os.path.abspath(request["site_packages"])
    why = not_a_directory(site_dir)
    if why == "no such directory":
        raise AgentError("no such directory: %s" % site_dir)
    if why:
        raise AgentError("%s: %s" % (site_dir, why))
    if site_dir not in sys.path:
        site.addsitedir(site_dir)  # honours .pth files, as the interpreter would
        sys.path.insert(0, site_dir)
    return site_dir


def check_relative(path, what="path"):
    """A state path must name a speculators source file under the import root: relative,
    no ``..``/``.``/empty parts, no NUL (``manifest_rules.is_speculators_path``). Raises
    AgentError otherwise."""
    if not is_speculators_path(path):
        raise AgentError("refusing %s %r: not a path under speculators' import root" % (what, path))
    return path
