"""SP019: speculators' pydantic config models are rebuilt with ``torch`` in scope (transformers 5).

The emitted code's effect is proven on the real vLLM 0.24.0 engine (transformers 5.24) by
``make test-engines`` (tests/e2e/test_newer_engines.py)."""

from __future__ import annotations

import textwrap
import zipfile

import pytest
from sandbox import wheel

from patcher.engine import run_codemod
from patcher.fixes.registry import loaded

PATCH = next(p for p in loaded().patches if p.id == "SP019")
BEFORE = '''\
class ReloadableBaseModel(BaseModel):
    @classmethod
    def reload_schema(cls):
        """Reload."""
        cls.model_rebuild(force=True)
'''


def run(src: str) -> tuple[str, str, str]:
    verdict, new, detail = run_codemod(PATCH, textwrap.dedent(src).encode())
    return verdict, new.decode(), detail


def test_rebuild_gets_torch_in_its_namespace():
    verdict, new, _ = run(BEFORE)
    assert verdict == "changed"
    assert "        import torch  # noqa: F401\n        cls.model_rebuild(force=True)\n" in new
    assert new.startswith(BEFORE.split("        cls.model_rebuild")[0])  # the rest untouched


def test_applied_twice_is_a_noop():
    _, once, _ = run(BEFORE)
    verdict, _, detail = run(once)
    assert verdict == "satisfied" and "torch is imported" in detail


@pytest.mark.parametrize("src", ["cls.model_rebuild()\n", "x = 1\n"], ids=["other call", "no rebuild"])
def test_unrecognised_code_is_refused(src):
    verdict, new, detail = run(src)
    assert verdict == "refused" and "model_rebuild(force=True)" in detail and new == src


def test_the_real_file_is_rewritten_and_still_parses():
    with zipfile.ZipFile(wheel("speculators", "0.3.0")) as z:
        src = z.read(PATCH.file).decode()
    verdict, new, _ = run(src)
    assert verdict == "changed"
    compile(new, PATCH.file, "exec")
