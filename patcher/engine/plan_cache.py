"""Plans shared between runs and between hosts: each distinct file planned once.

A file's plan (``file_plan.plan_file``) depends on nothing but its bytes, the selected patches
written for it (ids and versions), which of them the installed vLLM needs (its facts, not
its files), the patches this tool recorded as applied to it, the target's grammar version
and the codemods' code. Those, hashed, name the plan in the controller cache
(``patcher.cache``, kind ``plans``). Several hosts of a fan-out (forked workers) asking for
the same plan at once take the entry's lock: the first plans, the others wait and read, so
eight identical hosts cost one plan. A plan that cannot be made (a syntax error) is not
stored; the next run tries again and refuses in the same words.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from typing import TYPE_CHECKING, Iterator

from patcher import cache
from patcher.digest import tool as tool_digest
from patcher.engine.file_plan import FilePlan, Outcome, need_state, not_needed
from patcher.engine.file_plan import plan_file as make_plan

if TYPE_CHECKING:
    from patcher.engine.snapshot import Snapshot
    from patcher.fixes.patch import Patch

KIND = "plans"
TURNS = "plan-turns"


def _patch_key(snap: Snapshot, p: Patch) -> list:
    """What of ``p`` a cached plan depends on: id, version, its need on ``snap`` and, when not
    needed, the words that say so (they name the library), and a user patch's source digest."""
    need = need_state(snap, p)
    words = not_needed(snap, p) if need == "not-needed" else ""
    return [p.id, p.version, need, words, *([p.origin, p.source_sha256] if p.source_sha256 else [])]


def plan_file(
    snap: Snapshot, path: str, source: bytes, chosen: tuple[Patch, ...], recorded: dict[str, int]
) -> FilePlan:
    """``make_plan(snap, path, source, chosen, recorded)``, from the cache when this
    exact plan was made before (here or by another host). Raises what ``plan_file`` raises."""
    tool = tool_digest()
    mine = [p for p in chosen if p.file == path]
    if tool is None or not cache.enabled() or any(p.origin == "recorded" for p in mine):
        # A stand-in (a recorded user patch whose source is not loaded) never runs, not even
        # by way of a plan its source made earlier: it shares that source's digest.
        return make_plan(snap, path, source, chosen, recorded)
    key = cache.key(
        {
            "tool": tool,
            "python": snap.python_version,
            "path": path,
            "source": hashlib.sha256(source).hexdigest(),
            "recorded": recorded,
            "patches": [_patch_key(snap, p) for p in mine],
        }
    )  # a user patch is its source: same id and version, other code
    with cache.locked(KIND, key):
        stored = _load(cache.load(KIND, key), path, source, mine)
        if stored is not None:
            return stored
        made = make_plan(snap, path, source, chosen, recorded)
        cache.store(
            KIND,
            key,
            {
                "after": base64.b64encode(made.after).decode("ascii"),
                "outcomes": [[o.patch.id, o.state, o.detail] for o in made.outcomes],
            },
        )
        return made


def _load(entry: object, path: str, source: bytes, patches: list[Patch]) -> FilePlan | None:
    by_id = {p.id: p for p in patches}
    try:
        outcomes = [Outcome(by_id[pid], state, detail) for pid, state, detail in entry["outcomes"]]
        return FilePlan(path, source, base64.b64decode(entry["after"]), outcomes, reused=True)
    except (KeyError, TypeError, ValueError):
        return None


@contextlib.contextmanager
def turn(snap: Snapshot, chosen: tuple[Patch, ...]) -> Iterator[None]:
    """Hosts planning the very same files with the same patches take turns for the whole
    set, so that the first plans every file and the others read every one (``FilePlan.reused``
    then says which host planned: the Ansible collection reports it as ``plan_cache``)."""
    tool = tool_digest()
    if tool is None or not cache.enabled():
        yield
        return
    key = cache.key(
        {
            "turn": tool,
            "python": snap.python_version,
            "manifest": snap.manifest_sha256,
            "files": {p: None if d is None else hashlib.sha256(d).hexdigest() for p, d in sorted(snap.files.items())},
            "patches": [[p.id, p.version, p.source_sha256] for p in chosen],
        }
    )
    with cache.locked(TURNS, key):  # its own lock files: a turn is held while plan entries are locked
        yield
