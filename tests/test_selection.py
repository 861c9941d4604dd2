"""--only/--skip keep each verb's requires links whole, and only the ones it needs.

On the shipped patches: SP012 and SP022 require SP010 (they call or rewrite what it adds)."""

from __future__ import annotations

import pytest

from patcher.errors import UserError
from patcher.fixes.registry import loaded

pytestmark = pytest.mark.fast

select = loaded().select  # the shipped patches (and any installed pack)


def ids(patches) -> list[str]:
    return [p.id for p in patches]


def test_apply_may_take_a_patch_whose_dependents_stay_pending():
    assert ids(select(("SP010",), (), "requires")) == ["SP010"]


def test_apply_refuses_a_patch_without_what_it_requires():
    with pytest.raises(UserError, match=r"^SP012 requires SP010: select them together$"):
        select(("SP012",), (), "requires")
    assert ids(select(("SP012", "SP010"), (), "requires")) == ["SP010", "SP012"]


def test_revert_refuses_dropping_a_patch_its_dependents_need():
    with pytest.raises(UserError, match=r"^SP012, SP022, SP028 require\(s\) SP010, so reverting SP010 alone"):
        select(("SP010",), (), "dependents")
    assert ids(select(("SP012", "SP029"), (), "dependents")) == ["SP012", "SP029"]  # SP029 requires SP012


def test_reading_verbs_take_any_choice():
    assert ids(select(("SP012",), ())) == ["SP012"]
    assert "SP010" not in ids(select((), ("SP010",)))


def test_revert_counts_only_dependents_the_install_has():
    """On vLLM 0.16 SP024 is never applied: reverting SP020 alone is fine there."""
    assert ids(select(("SP020",), (), "dependents", {"SP020", "SP021"})) == ["SP020"]
    with pytest.raises(UserError, match=r"^SP024 require\(s\) SP020"):
        select(("SP020",), (), "dependents", {"SP020", "SP024"})


def test_every_broken_link_is_named_at_once():
    with pytest.raises(UserError) as refused:
        select((), ("SP010",), "requires")
    assert (
        str(refused.value) == "SP022 requires SP010; SP028 requires SP010; SP012 requires SP010: select them together"
    )
