"""Issue 38: the manifest as typed values on the controller (``patcher.fixes.manifest``).

Parsed and written back, a manifest is the dict the agent wrote, byte for byte; the strict
parse refuses what the agent's ``state.manifest_problem`` refuses, in its words; the
tolerant parse (``repair``) keeps what it can."""

from __future__ import annotations

import json

import pytest

from patcher.agent.common import REPAIR_HINT as AGENT_REPAIR_HINT
from patcher.agent.state import manifest_problem
from patcher.errors import UserError
from patcher.fixes.manifest import REPAIR_HINT, FileRecord, Manifest, UserPatchRecord, problem

pytestmark = pytest.mark.fast

GEN = "speculators/models/eagle3/core.py"
A, B, C = "a" * 64, "b" * 64, "c" * 64

WRITTEN = {
    "tool": "speculators-patch 0.9.0",
    "speculators_version": "0.3.0",
    "vllm_versions": "0.16.0",
    "files": {
        GEN: {
            "pristine_sha256": A,
            "patched_sha256": B,
            "patches": {"SP004": 2, "FIX001": 1},
            "checked": {"python": "3.12.1", "tool": C, "satisfied": {"SP004": [2, "done"]}},
        },
        "speculators/utils.py": {"pristine_sha256": B, "patched_sha256": C, "patches": {"SP007": 1}},
    },
    "user_patches": {
        "FIX001": {
            "name": "fix-one",
            "version": 1,
            "title": "fix one",
            "file": GEN,
            "origin": "file",
            "source": "/home/u/fix001.py",
            "sha256": C,
        }
    },
}


def _disk(data) -> bytes:
    """manifest.json as the agent writes it (patcher/agent/commit.py)."""
    return json.dumps(data, indent=1, sort_keys=True).encode("utf-8")


def test_a_parsed_manifest_is_written_back_byte_for_byte():
    manifest = Manifest.parse(json.loads(_disk(WRITTEN)))
    assert manifest.to_json() == _disk(WRITTEN)
    assert manifest.as_dict() == WRITTEN
    assert manifest.files[GEN].patches == {"SP004": 2, "FIX001": 1}
    assert manifest.user_patches["FIX001"].source == "/home/u/fix001.py"
    assert manifest.patches_of("speculators/nothing.py") == {}


def test_keys_this_version_does_not_know_are_kept():
    data = json.loads(_disk(WRITTEN))
    data["files"][GEN]["later"] = [1, 2]
    data["user_patches"]["FIX001"]["version"] = "one"  # not an int: kept as read, typed None
    manifest = Manifest.parse(data)
    assert manifest.files[GEN].extra == {"later": [1, 2]}
    assert manifest.user_patches["FIX001"].version is None
    assert manifest.files[GEN].as_dict() == data["files"][GEN]
    assert manifest.user_patches["FIX001"].as_dict() == data["user_patches"]["FIX001"]


def test_records_built_here_give_the_dict_written_before():
    record = FileRecord(A, B, {"SP004": 2})
    assert record.as_dict() == {"pristine_sha256": A, "patched_sha256": B, "patches": {"SP004": 2}}
    built = Manifest("speculators-patch 0.9.0", "0.3.0", None, {GEN: record})
    assert built.as_dict() == {
        "tool": "speculators-patch 0.9.0",
        "speculators_version": "0.3.0",
        "vllm_versions": None,
        "files": {GEN: record.as_dict()},
    }
    users = Manifest("t", "0.3.0", None, {GEN: record}, {"FIX001": UserPatchRecord(name="n", version=1)})
    assert users.as_dict()["user_patches"] == {"FIX001": {"name": "n", "version": 1}}


MALFORMED = [
    [],
    {},
    {"files": []},
    {"files": {"../etc/passwd": {}}},
    {"files": {"speculators/x.txt": {}}},
    {"files": {GEN: "no record"}},
    {"files": {GEN: {"pristine_sha256": "x", "patched_sha256": B, "patches": {}}}},
    {"files": {GEN: {"pristine_sha256": A, "patched_sha256": None, "patches": {}}}},
    {"files": {GEN: {"pristine_sha256": A, "patched_sha256": B}}},
    {"files": {GEN: {"pristine_sha256": A, "patched_sha256": B, "patches": {"SP004": "2"}}}},
    {"files": {GEN: {"pristine_sha256": A, "patched_sha256": B, "patches": ["SP004"]}}},
]


@pytest.mark.parametrize("data", MALFORMED)
def test_the_strict_parse_refuses_what_the_agent_refuses_in_its_words(data):
    assert REPAIR_HINT == AGENT_REPAIR_HINT
    why = manifest_problem(data)
    assert why and problem(data) == why
    with pytest.raises(UserError) as refused:
        Manifest.parse(data, "/site/.speculators-patch/manifest.json")
    assert str(refused.value) == f"/site/.speculators-patch/manifest.json is damaged ({why}); {REPAIR_HINT}"
    assert "\n" not in str(refused.value)


def test_the_tolerant_parse_keeps_what_it_can():
    assert Manifest.parse_tolerant([]) is None
    assert Manifest.parse_tolerant({"files": "not a map"}).files == {}
    data = {
        "speculators_version": "0.3.0",
        "files": {
            GEN: {"pristine_sha256": A, "patched_sha256": 5, "patches": {"SP004": "2"}},
            "speculators/utils.py": "no record",
        },
        "user_patches": {"FIX001": "no record", "FIX002": {"origin": "file"}},
    }
    manifest = Manifest.parse_tolerant(data)
    entry = manifest.files[GEN]
    assert (entry.pristine_sha256, entry.patched_sha256, entry.patches) == (A, None, {})
    assert entry.as_dict() == data["files"][GEN]  # what it could not type is kept as read
    assert manifest.damaged == {"speculators/utils.py"}
    assert list(manifest.user_patches) == ["FIX002"] and manifest.user_patches["FIX002"].origin == "file"
    assert manifest.speculators_version == "0.3.0" and manifest.tool is None
