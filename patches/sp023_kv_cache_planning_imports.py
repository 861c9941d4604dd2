"""SP023: import the three KV cache helpers from kv_cache_planning where vLLM moved them (0.33).

speculators 0.3.0's generator imports ``_get_kv_cache_groups_uniform_spec``,
``get_kv_cache_config_from_groups`` and ``unify_hybrid_kv_cache_specs`` from
``vllm.v1.core.kv_cache_utils``; importing it fails on vLLM 0.33 (ImportError), which moved
them to the new module ``vllm/v1/core/kv_cache_planning.py`` (lines 314, 642 and 853 there; in
0.32 they were at kv_cache_utils.py:1260, 1588 and 1799). Their bodies are the same in both
releases, token for token. 0.33's own engine core plans the KV cache from that module too
(``vllm/v1/engine/core.py``: ``from vllm.v1.core.kv_cache_planning import
get_global_kv_cache_groups, get_kv_cache_configs``), whose default builder
(``DefaultKVCacheConfigBuilder``, the one ``Platform.get_kv_cache_config_builder_cls`` names,
vllm/platforms/interface.py:1474) calls the same module-level ``get_kv_cache_config_from_groups``.

Portable form: ``try`` the old import, ``except ImportError`` import the same three names from
``kv_cache_planning``. On vLLM 0.11-0.32 the first import succeeds, so the generator runs what
it ran before; on 0.33 it takes the moved functions.
"""

import libcst.matchers as m

from patcher.fixes.codemods import Replace
from patcher.fixes.patch import CheckHooks, Patch, Uncovered, VllmFact
from patcher.fixes.probes import function_moved

OLD = "vllm/v1/core/kv_cache_utils.py"
NEW = "vllm/v1/core/kv_cache_planning.py"
HELPERS = ("_get_kv_cache_groups_uniform_spec", "get_kv_cache_config_from_groups", "unify_hybrid_kv_cache_specs")


def _module(dotted: str) -> m.BaseMatcherNode:
    *outer, last = dotted.split(".")
    return m.Attribute(value=_module(".".join(outer)), attr=m.Name(last)) if outer else m.Name(last)


IMPORT = m.SimpleStatementLine(
    body=[
        m.ImportFrom(
            module=_module("vllm.v1.core.kv_cache_utils"),
            names=[m.ImportAlias(name=m.Name(name), asname=None) for name in HELPERS],
        )
    ]
)
NAMES = "".join(f"        {name},\n" for name in HELPERS)


class KvCachePlanningImports(Replace):
    DESCRIPTION = "from kv_cache_utils import <3 KV cache helpers> -> kv_cache_planning's where they moved (vLLM 0.33)"
    MATCH = IMPORT
    REPLACEMENT = f"""\
# vLLM >= 0.33 moved these three helpers, unchanged, to kv_cache_planning, where its engine
# core plans the KV cache (vllm/v1/engine/core.py).
try:
    from vllm.v1.core.kv_cache_utils import (
{NAMES}    )
except ImportError:
    from vllm.v1.core.kv_cache_planning import (
{NAMES}    )
"""
    SATISFIED = m.ImportFrom(module=_module("vllm.v1.core.kv_cache_planning"))
    SATISFIED_REASON = "the generator imports the KV cache helpers from kv_cache_planning where they are"
    EXPECTED = f"'from vllm.v1.core.kv_cache_utils import ({', '.join(HELPERS)},)' in the generator"
    TOUCHES = m.ImportFrom(
        module=_module("vllm.v1.core.kv_cache_utils"),
        names=[m.ZeroOrMore(), m.ImportAlias(name=m.OneOf(*(m.Name(name) for name in HELPERS))), m.ZeroOrMore()],
    )


PATCH = Patch(
    id="SP023",
    name="kv-cache-planning-imports",
    version=1,
    title="KV cache helpers: import them from kv_cache_planning where vLLM moved them (0.33)",
    risk="on vLLM 0.33 the generator cannot be imported: the KV cache helpers moved",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=KvCachePlanningImports,
    facts=tuple(
        VllmFact(
            summary=f"{name} moved from kv_cache_utils to kv_cache_planning",
            symbol=f"kv_cache_planning.{name}",
            first_release="0.33.0",
            probe=function_moved(OLD, NEW, name),
        )
        for name in HELPERS
    ),
    order=170,
    portable=True,
    # speculators 0.4.x's generator imports the three KV cache helpers as 0.3.0's does (plus
    # two that stayed in kv_cache_utils), but it also lacks SP020's layout resolution and
    # passes its fixed block size to the Scheduler: a port SP015-SP018 do not make.
    checks=CheckHooks(
        uncovered=(
            Uncovered(
                "~=0.4.0",
                "kv_cache_planning.get_kv_cache_config_from_groups",
                "its generator imports _get_kv_cache_groups_uniform_spec, get_kv_cache_config_from_groups and "
                "unify_hybrid_kv_cache_specs from vllm.v1.core.kv_cache_utils, which this vLLM moved to "
                "kv_cache_planning",
            ),
        )
    ),
)
