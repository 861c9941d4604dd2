"""``speculators-patch new``: a commented patch file and its pytest file to start from.

The patch skeleton works as written: it replaces the value of one module-level assignment
(``NAME = OLD`` -> ``NAME = NEW``), says "already satisfied" when it finds ``NEW`` and
refuses anything else; the test file checks the three cases (before/after, no-op,
refusal) on small inline sources. Edit both for the real fix.
"""

from __future__ import annotations

import re
from pathlib import Path

from patcher.errors import UserError
from patcher.fixes.userpatches.loader import RESERVED_PREFIX, USER_ID

PATCH_TEMPLATE = '''\
"""{id}: <one line: what breaks, and what this changes>.

Written for speculators {speculators} ({file}). Load it with
`speculators-patch diff --patch-file {name}` (dry run), then `apply --patch-file {name}`;
`revert --only {id}` takes it out again (the file is not needed for that).
"""

import libcst as cst
import libcst.matchers as m

from patcher import Patch, PatchCodemod

# What the fix does: the module-level assignment NAME = OLD becomes NAME = NEW.
# (Source text; edit these three, or replace the codemod below with your own.)
NAME = "CHANGE_ME"
OLD = "0"
NEW = "1"


class {cls}(PatchCodemod):
    """{id}: ``{{NAME}} = {{OLD}}`` -> ``{{NAME}} = {{NEW}}``.

    A codemod has three outcomes: it returns the changed module, it calls
    ``self.already_satisfied(why)`` (the fix is there: ``apply`` again is a no-op), or it
    calls ``self.refuse(node, expected)`` (code it does not recognise: nothing is written,
    the user is told the file, line and the shape expected). Never guess.
    """

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        assign = m.Assign(targets=[m.AssignTarget(target=m.Name(NAME))])
        found = [s for s in tree.body if m.matches(s, m.SimpleStatementLine(body=[assign]))]
        if len(found) != 1:
            self.refuse(None, f"one module-level assignment {{NAME}} = {{OLD}}")
        value = tree.code_for_node(found[0].body[0].value)
        if value == NEW:  # the already-satisfied check: apply twice changes nothing
            self.already_satisfied(f"{{NAME}} is already {{NEW}}")
        if value != OLD:  # the refusal: someone changed it to something we did not plan for
            self.refuse(found[0], f"{{NAME}} = {{OLD}} (found {{value}})")
        new_value = cst.parse_expression(NEW)
        return tree.with_changes(body=[
            s.with_changes(body=[s.body[0].with_changes(value=new_value)]) if s is found[0] else s
            for s in tree.body
        ])


PATCH = Patch(
    id="{id}",                 # letters then digits; the SP prefix is reserved for shipped patches
    name="{slug}",             # a slug, also accepted by --only/--skip
    version=1,                 # bump whenever the emitted code changes
    title="<one line for tables>",
    file="{file}",
    codemod={cls},
    speculators="=={speculators}",  # the speculators releases this was written against
    order=1000,                # after the shipped patches of the same file
    # facts=(VllmFact(...),)   # optional: apply only where vLLM's source shows the problem;
    #                          # without facts the patch is always needed
)
'''

TEST_TEMPLATE = '''\
"""Tests for {id} ({name}): before/after, no-op, refusal. Run: python -m pytest {test_name}"""

import textwrap
from pathlib import Path

from patcher import load_patch_file, run_codemod

PATCH = load_patch_file(str(Path(__file__).with_name("{name}")))
MOD = __import__("sys").modules[PATCH.codemod.__module__]  # NAME, OLD, NEW of the patch file


def run(source: str):
    verdict, new, detail = run_codemod(PATCH, textwrap.dedent(source).encode())
    return verdict, new.decode(), detail


def test_rewrites_before_into_after():
    verdict, new, _ = run(f"import os\\n{{MOD.NAME}} = {{MOD.OLD}}  # kept comment\\n")
    assert verdict == "changed"
    assert new == f"import os\\n{{MOD.NAME}} = {{MOD.NEW}}  # kept comment\\n"


def test_applied_twice_changes_nothing():
    verdict, new, detail = run(f"{{MOD.NAME}} = {{MOD.NEW}}\\n")
    assert verdict == "satisfied" and new == f"{{MOD.NAME}} = {{MOD.NEW}}\\n", detail


def test_refuses_code_it_does_not_know():
    verdict, new, detail = run(f"{{MOD.NAME}} = compute()\\n")
    assert verdict == "refused" and "expected" in detail
    assert run("x = 1\\n")[0] == "refused"
'''


def render(patch_id: str, file: str, name: str, speculators: str = "0.3.0") -> tuple[str, str]:
    """The patch file's and its test file's source (``name``: the patch file's name)."""
    fields = {
        "id": patch_id,
        "file": file,
        "name": name,
        "test_name": f"test_{name}",
        "speculators": speculators,
        "cls": patch_id.capitalize() + "Codemod",
        "slug": patch_id.lower(),
    }
    return PATCH_TEMPLATE.format(**fields), TEST_TEMPLATE.format(**fields)


def write(patch_id: str, file: str, output: str, speculators: str = "0.3.0", force: bool = False) -> tuple[Path, Path]:
    """Write the patch file ``output`` and ``test_<output name>`` next to it.

    Returns both paths. Raises ``UserError`` for a bad id or file, or when either exists
    (unless ``force``).
    """
    if not USER_ID.fullmatch(patch_id) or re.fullmatch(rf"{RESERVED_PREFIX}[0-9]+", patch_id):
        raise UserError(
            f"patch id {patch_id!r}: letters then digits, not starting with {RESERVED_PREFIX} "
            f"(reserved for shipped patches), e.g. FIX001"
        )
    if not (file.startswith("speculators/") and file.endswith(".py") and ".." not in file.split("/")):
        raise UserError(
            f"--file {file!r}: the speculators file to patch, e.g. "
            f"speculators/data_generation/vllm_hidden_states_generator.py"
        )
    out = Path(output)
    if out.suffix != ".py":
        raise UserError(f"-o {output!r}: the patch file must end in .py")
    test = out.with_name(f"test_{out.name}")
    for path in (out, test):
        if path.exists() and not force:
            raise UserError(f"{path} exists; choose another -o or pass --force to overwrite")
    patch_source, test_source = render(patch_id, file, out.name, speculators)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(patch_source, encoding="utf-8")
        test.write_text(test_source, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot write {e.filename}: {e.strerror}") from None
    return out, test
