"""SP019: speculators' pydantic config models are rebuilt with ``torch`` in scope (transformers 5).

The emitted code's effect is proven on the real vLLM 0.24.0 engine (transformers 5.24) by
``make test-engines`` (tests/e2e/test_newer_engines.py)."""

from __future__ import annotations

import zipfile

import pytest
from codemods import codemod, refusal_test, rewrite_test
from sandbox import wheel

from patcher.fixes.registry import loaded

PATCH = next(p for p in loaded().patches if p.id == "SP019")
BEFORE = '''\
class ReloadableBaseModel(BaseModel):
    @classmethod
    def reload_schema(cls):
        """Reload."""
        cls.model_rebuild(force=True)
'''

REWRITES = [
    pytest.param(
        "SP019",
        BEFORE,
        '''\
        class ReloadableBaseModel(BaseModel):
            @classmethod
            def reload_schema(cls):
                """Reload."""
                # transformers 5's PretrainedConfig annotations name torch; model_rebuild resolves them in
                # this frame's namespace.
                import torch  # noqa: F401
                cls.model_rebuild(force=True)
        ''',
        id="torch imported right before the rebuild",
    ),
]

REFUSALS = [
    pytest.param("SP019", "cls.model_rebuild()\n", "model_rebuild(force=True)", id="other call"),
    pytest.param("SP019", "x = 1\n", "model_rebuild(force=True)", id="no rebuild"),
]


test_pydantic_torch_annotations = rewrite_test(REWRITES)


@pytest.mark.fast
def test_rebuild_gets_torch_in_its_namespace():
    verdict, new, _ = codemod(PATCH, BEFORE)
    assert verdict == "changed"
    assert "        import torch  # noqa: F401\n        cls.model_rebuild(force=True)\n" in new
    assert new.startswith(BEFORE.split("        cls.model_rebuild")[0])  # the rest untouched


@pytest.mark.fast
def test_applied_twice_is_a_noop():
    _, once, _ = codemod(PATCH, BEFORE)
    verdict, _, detail = codemod(PATCH, once)
    assert verdict == "satisfied" and "torch is imported" in detail


test_unrecognised_code_is_refused = refusal_test(REFUSALS)


def test_the_real_file_is_rewritten_and_still_parses():
    with zipfile.ZipFile(wheel("speculators", "0.3.0")) as z:
        src = z.read(PATCH.file).decode()
    verdict, new, _ = codemod(PATCH, src)
    assert verdict == "changed"
    compile(new, PATCH.file, "exec")
