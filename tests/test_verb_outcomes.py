"""Each verb's result says its own row of a run over several hosts (``outcome``: the outcome
word and its reason), which ``cli.fanout`` shows as it is: the words are pinned here, per
verb, on results built by hand (no target is read)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from patcher.commands.apply import Applied
from patcher.commands.diff import Diffed
from patcher.commands.listing import Listed
from patcher.commands.repair import Repaired
from patcher.commands.revert import Reverted
from patcher.commands.selftest import SelfTested
from patcher.commands.status import Status
from patcher.commands.verify import NO_PROOF, InstallCheck, Verified

pytestmark = pytest.mark.fast


def _commit(written=(), adopted=(), unfinished=None):
    return SimpleNamespace(written=list(written), adopted=list(adopted), unfinished=unfinished)


def _check(failing, rows=(), unproven=None):
    return InstallCheck([], list(rows), None, unproven, [], [], list(failing))


def _applied(dry_run=False, written=(), adopted=(), check=None, changed=(), unfinished=None):
    data = {"dry_run": dry_run, "written": list(written), "adopted": list(adopted)}
    return Applied(_commit(written, adopted, unfinished), [], list(changed), set(), check, data)


@pytest.mark.parametrize(
    ("done", "outcome"),
    [
        (_applied(dry_run=True, changed=["a.py", "b.py"]), ("would-change", "2 file(s)")),
        (_applied(dry_run=True), ("unchanged", "")),
        (_applied(written=["a.py"], check=_check([])), ("changed", "1 file(s) written")),
        (_applied(adopted=["a.py"]), ("changed", "1 file(s) adopted")),
        (_applied(written=["a.py"], adopted=["a.py"]), ("changed", "1 file(s) written; 1 file(s) adopted")),
        (_applied(check=_check([])), ("unchanged", "")),
        (
            _applied(written=["a.py"], check=_check([NO_PROOF])),
            ("unproven", "1 file(s) written; verify: NOT PROVEN (every static check passes)"),
        ),
        (
            _applied(check=_check([NO_PROOF]), unfinished="cleanup"),  # exit 1: not only the proof
            ("disagrees", f"verify: FAILED ({NO_PROOF})"),
        ),
        (_applied(check=_check(["the calls"])), ("disagrees", "verify: FAILED (the calls)")),
    ],
)
def test_apply(done, outcome):
    assert done.outcome == outcome


def test_diff():
    assert Diffed([], "+x\n", {"changed": True, "modified_files": []}).outcome == (
        "would-change",
        "diff printed in --json",
    )
    assert Diffed([], "", {"changed": False, "modified_files": ["a.py"]}).outcome == ("unchanged", "")


def test_status_is_the_install_state():
    found = Status([], [], {}, {"install": {"state": "partial", "reason": "needed, not applied: SP001"}})
    assert found.outcome == ("partial", "needed, not applied: SP001") and found.exit_code == 1


def test_revert():
    dry = {"dry_run": True, "written": []}
    assert Reverted(_commit(), ["a.py"], dry).outcome == ("would-change", "1 file(s)")
    assert Reverted(_commit(), [], dry).outcome == ("unchanged", "")
    done = Reverted(
        _commit(["a.py", "b.py"], unfinished="cleanup"), [], {"dry_run": False, "written": ["a.py", "b.py"]}
    )
    assert done.outcome == ("changed", "2 file(s) written") and done.exit_code == 1


def test_verify():
    assert Verified(_check([]), {}).outcome == ("ok", "")
    assert Verified(_check([NO_PROOF], unproven="no proof of 0.40"), {}).outcome == ("unproven", "no proof of 0.40")
    assert Verified(_check([NO_PROOF]), {}).outcome == ("unproven", "no engine proof")
    rows = [{"id": "SP002", "verdict": "missing"}, {"id": "SP001", "verdict": "ok"}, {"id": "SP003", "verdict": "x"}]
    assert Verified(_check(["the patch verdicts (fix column)"], rows), {}).outcome == (
        "disagrees",
        "verify failed: SP002, SP003",
    )


def test_repair():
    def repaired(was, unrestorable, rewritten=()):
        result = SimpleNamespace(unrestorable=unrestorable, dropped=[], rewritten=list(rewritten))
        return Repaired(result, was, [], [], "", {})

    assert repaired("damaged", ["a.py", "b.py"]).outcome == (
        "unrestorable",
        "2 file(s) differ from what pip installed; nothing kept restores them",
    )
    assert repaired("damaged", []).outcome == ("repaired", "")
    assert repaired(None, []).outcome == ("ok", "")
    assert repaired(None, [], ["rewrote the record of a.py"]).outcome == ("repaired", "")  # issue 46


def test_selftest():
    report = {"ok": False, "archs": [{"arch": "llama", "ok": True}, {"arch": "qwen3", "ok": False}], "bad_captures": 3}
    assert SelfTested(report, {}).outcome == ("disagrees", "selftest failed: qwen3 (3 captures out of bound)")
    assert SelfTested({**report, "ok": True}, {}).outcome == ("ok", "")


def test_check_draft():
    from patcher.checks.draft_serving import Check
    from patcher.commands.check_draft import DraftChecked

    def checked(*verdicts):
        return DraftChecked("d", "0.34.0", "", [Check(f"c{i}", v, "") for i, v in enumerate(verdicts)])

    assert checked("ok", "problem", "unknown", "problem").outcome == ("disagrees", "not served as trained: c1, c3")
    assert checked("ok", "unknown").outcome == ("unproven", "not checked: c1")
    assert checked("ok", "ok").outcome == ("ok", "")
    assert [checked(*v).exit_code for v in (("problem", "unknown"), ("unknown",), ("ok",))] == [1, 3, 0]


def test_list():
    assert Listed([], {}, "0 patch(es)").outcome == ("ok", "")
