"""SP033: preprocessing drops conversations without saying how many (speculators' own logic).

``build_eagle3_dataset`` (speculators/data_generation/preprocessing.py) tokenizes every
conversation with ``dataset.map(_preprocess_batch, batched=True, ...)``. ``_preprocess_batch``
leaves out a conversation that is empty, has no turn it can name (``_normalize_conversation``),
or raises anywhere in its chat template, tokenizer offsets or loss mask (``except Exception``,
one warning among the dataset's progress bars): the training set shrinks with no error and
no count. A library change that breaks one of those steps (a chat template, a tokenizer's
``return_offsets_mapping``) then empties the data a draft is trained on, silently. Measured:
a dataset mixing ``from``/``value`` and ``role``/``content`` turns lost every ``role``
conversation on transformers 4.57.6 and 5.22.2 alike, with one ``Unknown role 'None'``
warning per turn and nothing else.

The fix counts the conversations before and after the ``map`` and, when rows are missing,
logs one warning with both numbers, where speculators logs its pipeline (``log``). Portable:
it reads only ``len()`` of the datasets ``map`` takes and returns.
"""

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import statements
from patcher.fixes.patch import Patch, PatchCodemod

FUNCTION = "build_eagle3_dataset"
COUNT = "conversations_in"
MAP = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(m.Name("dataset"))],
            value=m.Call(func=m.Attribute(value=m.Name("dataset"), attr=m.Name("map"))),
        )
    ]
)
COUNTED = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name(COUNT))])])
BEFORE = f"{COUNT} = len(dataset)\n"
AFTER = f"""\
# A conversation _preprocess_batch cannot use leaves no row: say how many are gone.
if len(dataset) < {COUNT}:
    log.warning(
        f"preprocessing dropped {{{COUNT} - len(dataset)}} of {{{COUNT}}} conversations "
        "(empty, without usable turns, or failed: see the warnings above); "
        "they are not in the training data"
    )
"""


class CountDroppedConversations(PatchCodemod):
    DESCRIPTION = f"{FUNCTION}: log how many conversations dataset.map(...) dropped"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        functions = [s for s in tree.body if m.matches(s, m.FunctionDef(name=m.Name(FUNCTION)))]
        if len(functions) != 1:
            self.refuse(functions[1] if functions else None, f"one module-level function {FUNCTION}")
        fn = functions[0]
        assert isinstance(fn, cst.FunctionDef) and isinstance(fn.body, cst.IndentedBlock)
        body = list(fn.body.body)
        if any(m.matches(s, COUNTED) for s in body):
            self.already_satisfied(f"{FUNCTION} counts the conversations it maps")
        maps = [i for i, s in enumerate(body) if m.matches(s, MAP)]
        if len(maps) != 1:
            self.refuse(fn, f"one 'dataset = dataset.map(...)' statement in {FUNCTION}")
        at = maps[0]
        mapped = body[at]
        before = statements(BEFORE, mapped.leading_lines).nodes
        after = statements(AFTER).nodes
        body[at : at + 1] = [*before, mapped.with_changes(leading_lines=[]), *after]
        new_fn = fn.with_changes(body=fn.body.with_changes(body=body))
        return tree.with_changes(body=[new_fn if s is fn else s for s in tree.body])


PATCH = Patch(
    id="SP033",
    name="preprocessing-counts-drops",
    version=1,
    title="Preprocessing: say how many conversations were dropped (none vanish silently)",
    risk="conversations that fail to tokenize vanish from the training data without a count",
    file="speculators/data_generation/preprocessing.py",
    codemod=CountDroppedConversations,
    speculators=">=0.3.0,<0.4.1",
    order=10,
    portable=True,
)
