"""What a manifest this tool wrote looks like: one rule that both sides run.

The agent refuses to load or commit a manifest that breaks it (``state.load_state``,
``commit``); the controller's strict parse (``patcher.fixes.manifest.Manifest.parse``)
refuses the same manifests in the same words. Standard library only, Python 3.8+.
"""

from __future__ import annotations

import re

HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")

# ``speculators-patch repair`` as a way-out token (``patcher.ways.Way("repair")``, ``common.way``)
REPAIR_HINT = (
    "`\u27e6speculators-patch repair\u27e7` rebuilds the record from the files and the verified pristine copies"
)


def is_speculators_path(path):
    """True for a relative ``speculators/...py`` path under the import root: no empty, ``.``
    or ``..`` part, no NUL or backslash."""
    return (
        isinstance(path, str)
        and path.startswith("speculators/")
        and path.endswith(".py")
        and "\0" not in path
        and "\\" not in path
        and not any(part in ("", ".", "..") for part in path.split("/"))
    )


def is_patches_map(patches):
    """True for a file record's ``patches`` map: {patch id (str): version (int)}."""
    return isinstance(patches, dict) and all(isinstance(k, str) and isinstance(v, int) for k, v in patches.items())


def manifest_problem(manifest):
    """Why a parsed manifest (any JSON value) is not one this tool wrote, as a short phrase
    ('it has no "files" record', 'the entry of PATH has no valid pristine_sha256', ...), or
    None when it is."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return 'it has no "files" record'
    for path, entry in manifest["files"].items():
        if not is_speculators_path(path):
            return "it names %r, which is not a speculators file" % (path,)
        if not isinstance(entry, dict):
            return "the entry of %s is not a record" % path
        for key in ("pristine_sha256", "patched_sha256"):
            if not isinstance(entry.get(key), str) or not HEX_DIGEST.match(entry[key]):
                return "the entry of %s has no valid %s" % (path, key)
        if not is_patches_map(entry.get("patches")):
            return "the entry of %s has no valid patches list" % path
    return None
