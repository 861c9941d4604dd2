"""The manifest a target keeps next to its install, as typed values on the controller.

The agent (``patcher/agent/state.py``, standard library only) reads and validates
``<site-packages>/.speculators-patch/manifest.json`` and sends it as JSON; the controller
parses it once, where the snapshot is read (``engine.snapshot.read_snapshot``), into a
``Manifest``. New records are built as ``FileRecord`` and ``UserPatchRecord`` values, and
``Manifest.as_dict`` gives back the very dict the agent writes (``json.dumps(...,
indent=1, sort_keys=True)``, ``Manifest.to_json``): the format on disk does not change.

Two parses: ``Manifest.parse`` (strict) refuses a manifest that is not of the shape this
tool writes, in the agent's words (one line, ``UserError``); ``Manifest.parse_tolerant``
(``repair``) keeps what it can of a damaged one. Keys this version does not know are kept
as read (``extra``) and written back unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from patcher.agent.manifest_rules import REPAIR_HINT, is_patches_map
from patcher.agent.manifest_rules import manifest_problem as problem
from patcher.errors import UserError

USER_PATCHES = "user_patches"  # the top-level key of the user patch records

_FILE_KEYS = ("pristine_sha256", "patched_sha256", "patches", "checked")
_USER_KEYS = ("name", "version", "title", "file", "origin", "source", "sha256")
_TOP_KEYS = ("tool", "speculators_version", "vllm_versions", "files", USER_PATCHES)


@dataclass(frozen=True)
class FileRecord:
    """What the manifest records about one speculators file this tool patched.

    ``pristine_sha256``: sha256 (64 lowercase hex) of the file before the first patch (its
    kept copy is ``pristine/<path>.sha256-<hex>``); ``patched_sha256``: sha256 of the bytes
    the patches gave; ``patches``: {patch id: patch version} applied to it, shipped and user
    patches alike; ``checked``: ``engine.fast_path.record``'s record of what every codemod
    said of the patched bytes (None: none). ``extra``: keys this version does not know, as
    read. A record from ``Manifest.parse`` always has both digests; one kept by
    ``Manifest.parse_tolerant`` may have None where the manifest had no valid value.
    The maps are the record's own copies: read them, never change them.
    """

    pristine_sha256: str | None
    patched_sha256: str | None
    patches: dict[str, int] = field(default_factory=dict)
    checked: dict | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The record as the manifest holds it (``checked`` only when there is one)."""
        out: dict[str, Any] = {
            "pristine_sha256": self.pristine_sha256,
            "patched_sha256": self.patched_sha256,
            "patches": dict(self.patches),
        }
        if self.checked is not None:
            out["checked"] = self.checked
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, entry: dict) -> FileRecord:
        """A record read from its dict, keeping what is well formed: a digest that is not a
        string is None, a ``patches`` map that is not {str: int} is empty, ``checked`` that
        is not a map is None (each such value kept as read in ``extra``, so ``as_dict``
        gives the dict back). Raises nothing (``Manifest.parse`` checks the shape first)."""
        patches = entry.get("patches")
        good_patches = is_patches_map(patches)
        checked = entry.get("checked")
        extra = {k: v for k, v in entry.items() if k not in _FILE_KEYS}
        if "patches" in entry and not good_patches:
            extra["patches"] = patches
        if "checked" in entry and not isinstance(checked, dict):
            extra["checked"] = checked
        for key in ("pristine_sha256", "patched_sha256"):
            if key in entry and not isinstance(entry[key], str):
                extra[key] = entry[key]
        return cls(
            pristine_sha256=_str(entry.get("pristine_sha256")),
            patched_sha256=_str(entry.get("patched_sha256")),
            patches=dict(patches) if good_patches else {},
            checked=checked if isinstance(checked, dict) else None,
            extra=extra,
        )


@dataclass(frozen=True)
class UserPatchRecord:
    """What the manifest keeps about one user patch applied to the target
    (``manifest["user_patches"][id]``, ``fixes.userpatches.record``).

    ``name``, ``title``; ``version`` (int); ``file``: the speculators path it rewrites;
    ``origin``: ``"file"`` (``--patch-file``) or ``"package"`` (an installed pack);
    ``source``: the file's absolute path or ``"<distribution> <version>"``; ``sha256``: of
    the source file when it was applied. A field is None when the record lacks it or holds
    a value of another type (that value is then kept, as read, in ``extra`` with any key
    this version does not know).
    """

    name: str | None = None
    version: int | None = None
    title: str | None = None
    file: str | None = None
    origin: str | None = None
    source: str | None = None
    sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The record as the manifest holds it: every field that is set, then ``extra``."""
        out = {k: getattr(self, k) for k in _USER_KEYS if getattr(self, k) is not None}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, record: dict) -> UserPatchRecord:
        """A record read from its dict (raises nothing; see the class for what is kept)."""
        typed = {k: record[k] for k in _USER_KEYS if _typed(k, record.get(k))}
        extra = {k: v for k, v in record.items() if k not in typed}
        return cls(**typed, extra=extra)


@dataclass(frozen=True)
class Manifest:
    """A target's manifest: ``tool`` ("speculators-patch <version>" that wrote it),
    ``speculators_version`` and ``vllm_versions`` (the releases it was written for; None
    where unknown), ``files`` {speculators path: ``FileRecord``}, ``user_patches`` {user
    patch id: ``UserPatchRecord``}. ``damaged``: paths ``parse_tolerant`` found an entry for
    that is no record at all (``repair`` still knows they were recorded); always empty from
    ``parse``. ``extra``: top-level keys this version does not know, as read (a manifest
    this version writes has none: ``as_dict`` writes only what ``new`` was given).
    """

    tool: str | None
    speculators_version: str | None
    vllm_versions: str | None
    files: dict[str, FileRecord] = field(default_factory=dict)
    user_patches: dict[str, UserPatchRecord] = field(default_factory=dict)
    damaged: frozenset[str] = frozenset()
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The dict the agent writes: ``tool``, ``speculators_version``, ``vllm_versions``,
        ``files``, then ``user_patches`` when there are any."""
        out: dict[str, Any] = {
            "tool": self.tool,
            "speculators_version": self.speculators_version,
            "vllm_versions": self.vllm_versions,
            "files": {p: r.as_dict() for p, r in self.files.items()},
        }
        if self.user_patches:
            out[USER_PATCHES] = {pid: r.as_dict() for pid, r in self.user_patches.items()}
        out.update(self.extra)
        return out

    def to_json(self) -> bytes:
        """``manifest.json`` as the agent writes it (``json.dumps(indent=1, sort_keys=True)``, UTF-8)."""
        return json.dumps(self.as_dict(), indent=1, sort_keys=True).encode("utf-8")

    def patches_of(self, path: str) -> dict[str, int]:
        """{patch id: version} the manifest records for ``path`` ({} for no record)."""
        entry = self.files.get(path)
        return dict(entry.patches) if entry is not None else {}

    @classmethod
    def parse(cls, data: Any, where: str = "manifest.json") -> Manifest:
        """The manifest the agent sent (``data``: the parsed JSON), checked to have the shape
        this tool writes: a ``files`` map of speculators paths to records with two 64-hex
        digests and a {str: int} patches map. Raises ``UserError`` in the agent's words
        ("<where> is damaged (<why>); `speculators-patch repair` ..."): one line."""
        why = problem(data)
        if why:
            raise UserError(f"{where} is damaged ({why}); {REPAIR_HINT}")
        return cls.parse_tolerant(data)

    @classmethod
    def parse_tolerant(cls, data: Any) -> Manifest | None:
        """What can be read of a manifest, damaged or not (``repair``): None when it is not
        a JSON object; a ``files`` that is no map reads as none; an entry that is no map is
        named in ``damaged``; fields are kept as ``FileRecord.from_dict`` and
        ``UserPatchRecord.from_dict`` say. Raises nothing."""
        if not isinstance(data, dict):
            return None
        files = data.get("files") if isinstance(data.get("files"), dict) else {}
        users = data.get(USER_PATCHES) if isinstance(data.get(USER_PATCHES), dict) else {}
        extra = {k: v for k, v in data.items() if k not in _TOP_KEYS}
        return cls(
            tool=data.get("tool"),
            speculators_version=data.get("speculators_version"),
            vllm_versions=data.get("vllm_versions"),
            files={p: FileRecord.from_dict(e) for p, e in files.items() if isinstance(e, dict)},
            user_patches={k: UserPatchRecord.from_dict(v) for k, v in users.items() if isinstance(v, dict)},
            damaged=frozenset(p for p, e in files.items() if not isinstance(e, dict)),
            extra=extra,
        )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _typed(key: str, value: Any) -> bool:
    """Whether ``value`` has the type ``UserPatchRecord`` gives field ``key``."""
    if key == "version":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, str)
