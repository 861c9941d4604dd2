"""A user's one-off fix, FIX001, as a patch file: the shape ``speculators-patch new`` writes,
filled in (the KV cache gets half of the free memory, not a fifth). Helpers write it, and
variants of it, where a test wants them."""

from __future__ import annotations

from pathlib import Path

FIX001 = '''\
"""FIX001: the KV cache gets half of the free memory, not a fifth (8k-token prompts)."""

import libcst as cst
import libcst.matchers as m

from patcher import Patch, PatchCodemod

NAME, OLD, NEW = "CACHE_MEMORY_FRACTION", "0.2", "0.5"


class CacheFraction(PatchCodemod):
    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        assign = m.Assign(targets=[m.AssignTarget(target=m.Name(NAME))])
        found = [s for s in tree.body if m.matches(s, m.SimpleStatementLine(body=[assign]))]
        if len(found) != 1:
            self.refuse(None, f"one module-level assignment {NAME} = {OLD}")
        value = tree.code_for_node(found[0].body[0].value)
        if value == NEW:
            self.already_satisfied(f"{NAME} is already {NEW}")
        if value != OLD:
            self.refuse(found[0], f"{NAME} = {OLD} (found {value})")
        return tree.with_changes(body=[
            s.with_changes(body=[s.body[0].with_changes(value=cst.parse_expression(NEW))]) if s is found[0] else s
            for s in tree.body
        ])


PATCH = Patch(
    id="FIX001",
    name="kv-cache-half",
    version=1,
    title="KV cache: half of the free memory, not a fifth",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=CacheFraction,
    order=1000,
)
'''

# What the user sees in the diff and the file: the one line FIX001 changes.
FIX001_LINE = "CACHE_MEMORY_FRACTION = 0.5  # Fraction of GPU memory for KV cache"


def write_fix001(directory: Path, name: str = "fix001.py", source: str = FIX001) -> Path:
    """Write FIX001 (or ``source``) as ``directory/name``; returns the path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(source, encoding="utf-8")
    return path
