"""SP026 (no extensible KV cache) and SP027 (Model Runner V2 recognised by its batch state), the
patches vLLM 0.34 needs: their facts on the real 0.33.0 and 0.34.0 wheels, the rewrite, the no-op
once applied, the refusal of a hand-edited variant, and the emitted code run on stand-ins.

0.34 runs only on a GPU here (torch 2.14): the whole patched install was proven there with
selftest (docs/selftest.md); tests/matrix checks its calls, imports and engine life cycle."""

from __future__ import annotations

import ast
import sys
import zipfile

import pytest
from codemods import codemod, refusal_test, rewrite_test
from sandbox import wheel

from patcher.fixes.library_source import LibrarySource
from patcher.fixes.registry import loaded
from speculators_patch_codemods.capture_methods import EITHER_RUNNER, PER_REQUEST
from speculators_patch_codemods.sp027_model_runner_v2_by_batch_state import FUNCTIONS, METHODS

PATCHES = {p.id: p for p in loaded().patches}
GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"
WORKER = "speculators/data_generation/custom_worker.py"


def vllm_files(release: str, paths) -> dict[str, bytes | None]:
    with zipfile.ZipFile(wheel("vllm", release)) as z:
        names = set(z.namelist())
        return {p: z.read(p) if p in names else None for p in paths}


def evidence(patch_id: str, release: str) -> list[tuple[bool, str]]:
    patch = PATCHES[patch_id]
    src = LibrarySource(vllm_files(release, {m for f in patch.facts for m in f.modules}), release)
    return [(e.holds, e.where) for e in (f.probe(src) for f in patch.facts)]


# -- the rewrites and refusals, string to string --------------------------------------------

REWRITES = [
    pytest.param(
        "SP026",
        """\
        VLLM_BLOCK_SIZE = 16  # Block size for KV cache


        def _create_vllm_config(self):
            cache_config = CacheConfig(
                block_size=VLLM_BLOCK_SIZE,
                enable_prefix_caching=False,
            )
        """,
        """\
        VLLM_BLOCK_SIZE = 16  # Block size for KV cache
        # vLLM >= 0.34 grows the KV cache after set-up unless told not to (CacheConfig.enable_extensible_kv_cache,
        # on for CUDA when unset); this generator sizes its cache once. Read once, at import.
        _FIXED_KV_CACHE = {"enable_extensible_kv_cache": False} if "enable_extensible_kv_cache" in CacheConfig.__dataclass_fields__ else {}


        def _create_vllm_config(self):
            cache_config = CacheConfig(
                block_size=VLLM_BLOCK_SIZE,
                enable_prefix_caching=False,
                **_FIXED_KV_CACHE,
            )
        """,
        id="SP026 the switch read once at import, passed as the last argument",
    ),
    pytest.param(
        "SP027",
        "import torch\n\n\n" + EITHER_RUNNER,
        "import torch\n\n\n" + FUNCTIONS + "\n\n" + METHODS,
        id="SP027 SP022's two methods recognise V2 by its batch state, helpers above the class",
    ),
]

REFUSALS = [
    pytest.param(
        "SP026",
        "VLLM_BLOCK_SIZE = 16\ncache_config = CacheConfig(block_size=16, enable_extensible_kv_cache=True)\n",
        "no enable_extensible_kv_cache= of its own",
        id="SP026 the switch set by hand",
    ),
    pytest.param(
        "SP026",
        "VLLM_BLOCK_SIZE = 16\nother = CacheConfig()\ncache_config = CacheConfig(block_size=16)\n",
        "one CacheConfig(...) call",
        id="SP026 a second CacheConfig",
    ),
    pytest.param(
        "SP027",
        EITHER_RUNNER.replace('v2 = type(runner).__module__.startswith("vllm.v1.worker.gpu.")', "v2 = True"),
        "SP022's _track_batch_layout, unedited (SP027 applies after SP022)",
        id="SP027 SP022's method edited",
    ),
    pytest.param("SP027", PER_REQUEST, "SP022's _track_batch_layout", id="SP027 SP022 not applied"),
]


test_vllm_034_fix = rewrite_test(REWRITES)


test_vllm_034_fix_refuses_unknown_code = refusal_test(REFUSALS)


def in_order(source: str, *ids: str) -> str:
    for patch_id in ids:
        verdict, source, detail = codemod(patch_id, source)
        assert verdict == "changed", (patch_id, detail)
    return source


@pytest.mark.parametrize(
    ("patch_id", "on_034", "on_033"),
    [
        ("SP026", "vllm/config/cache.py:395", "vllm/config/cache.py"),
        ("SP027", "vllm/v1/worker/cpu_worker.py:25", "vllm/v1/worker/cpu_worker.py"),
    ],
)
def test_facts_hold_on_034_only(patch_id, on_034, on_033):
    assert evidence(patch_id, "0.34.0") == [(True, on_034)]
    assert evidence(patch_id, "0.33.0") == [(False, on_033)]


# -- SP026 ----------------------------------------------------------------------------------


def test_sp026_passes_the_switch_where_cacheconfig_has_it(pristine_sources):
    before = pristine_sources[GENERATOR].decode()
    verdict, new, _ = codemod("SP026", before)
    assert verdict == "changed"
    calls = [n for n in ast.walk(ast.parse(new)) if isinstance(n, ast.Call) and ast.unparse(n.func) == "CacheConfig"]
    assert [ast.unparse(a) for a in calls[0].keywords][-1] == "**_FIXED_KV_CACHE"
    compile(new, GENERATOR, "exec")
    assert codemod("SP026", new)[:2] == ("satisfied", new)  # applying twice equals applying once
    assert new.replace("\r\n", "\n").count("_FIXED_KV_CACHE") == 2


@pytest.mark.parametrize(
    ("fields", "passed"),
    [
        ({"block_size", "enable_extensible_kv_cache"}, {"enable_extensible_kv_cache": False}),
        ({"block_size"}, {}),
    ],
    ids=["0.34: turned off", "0.11-0.33: nothing passed"],
)
def test_sp026s_choice_on_each_release(pristine_sources, fields, passed):
    new = codemod("SP026", pristine_sources[GENERATOR].decode())[1]
    line = next(ln for ln in new.splitlines() if ln.startswith("_FIXED_KV_CACHE = "))
    config = type("CacheConfig", (), {"__dataclass_fields__": dict.fromkeys(fields)})
    namespace = {"CacheConfig": config}
    exec(line, namespace)
    assert namespace["_FIXED_KV_CACHE"] == passed


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (
            ("enable_prefix_caching=False,", "enable_prefix_caching=False, enable_extensible_kv_cache=True,"),
            "no enable_extensible_kv_cache= of its own",
        ),
        (("enable_prefix_caching=False,", "enable_prefix_caching=False, **extra,"), "keyword arguments only"),
        (
            ("cache_config = CacheConfig(", "other = CacheConfig()\n        cache_config = CacheConfig("),
            "one CacheConfig(...) call",
        ),
    ],
    ids=["the switch set by hand", "a ** of the user's", "a second CacheConfig"],
)
def test_sp026_refuses_a_hand_edited_call(pristine_sources, edit, why):
    src = in_order(pristine_sources[GENERATOR].decode(), "SP004").replace(*edit)
    verdict, new, detail = codemod("SP026", src)
    assert (verdict, new) == ("refused", src) and why in detail


# -- SP027 ----------------------------------------------------------------------------------


@pytest.fixture
def after_sp022(pristine_sources) -> str:
    return in_order(pristine_sources[WORKER].decode(), "SP010", "SP022")


def test_sp027_rewrites_sp022s_methods(after_sp022):
    verdict, new, _ = codemod("SP027", after_sp022)
    assert verdict == "changed"
    assert 'type(runner).__module__.startswith("vllm.v1.worker.gpu.")' not in new
    assert "set VLLM_USE_V2_MODEL_RUNNER=0" not in new.replace('"set VLLM_USE_V2_MODEL_RUNNER=0 to select', "")
    compile(new, WORKER, "exec")
    assert codemod("SP027", new)[:2] == ("satisfied", new)


@pytest.mark.parametrize(
    "edit",
    [
        ('v2 = type(runner).__module__.startswith("vllm.v1.worker.gpu.")', "v2 = True"),
        ('"(execute_model_state): set VLLM_USE_V2_MODEL_RUNNER=0"', '"(execute_model_state): ask someone"'),
    ],
    ids=["_track_batch_layout edited", "_step_layout edited"],
)
def test_sp027_refuses_a_hand_edited_sp022_method(after_sp022, edit):
    src = after_sp022.replace(*edit)
    assert src != after_sp022
    verdict, new, detail = codemod("SP027", src)
    assert (verdict, new) == ("refused", src) and "unedited (SP027 applies after SP022)" in detail


def test_sp027_refuses_without_sp022(pristine_sources):
    src = in_order(pristine_sources[WORKER].decode(), "SP010")
    verdict, _, detail = codemod("SP027", src)
    assert verdict == "refused" and "SP022's _track_batch_layout" in detail


def _helpers(after_sp022: str) -> dict:
    new = codemod("SP027", after_sp022)[1]
    tree = ast.parse(new)
    code = "\n\n".join(
        ast.get_source_segment(new, f)
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and f.name in ("_keeps_batch_state", "_model_runner_advice")
    )
    namespace: dict = {}
    exec(code, namespace)
    return namespace


def test_sp027_recognises_v2_by_its_batch_state(after_sp022):
    keeps = _helpers(after_sp022)["_keeps_batch_state"]

    class V2From017:  # vllm/v1/worker/gpu/model_runner.py: set in __init__ from 0.17
        def __init__(self):
            self.execute_model_state = None

    class CpuV2(V2From017):  # vLLM 0.34's CPUModelRunner, of another module
        __module__ = "vllm.v1.worker.cpu.model_runner"

    class V2Before017:  # 0.12-0.16: stored by execute_model only
        def execute_model(self, scheduler_output):
            self.execute_model_state = (None, scheduler_output, None)

    class Other:
        def execute_model(self, scheduler_output):
            return None

    assert [keeps(r()) for r in (V2From017, CpuV2, V2Before017, Other)] == [True, True, True, False]


@pytest.mark.parametrize(
    ("v1_there", "advice"),
    [
        (True, "set VLLM_USE_V2_MODEL_RUNNER=0 to select vLLM's V1 model runner"),
        (False, "this vLLM has no other model runner (V1 was removed in 0.34)"),
    ],
    ids=["up to 0.33", "0.34"],
)
def test_sp027_advises_what_the_installed_vllm_has(after_sp022, tmp_path, monkeypatch, v1_there, advice):
    worker = tmp_path / "vllm" / "v1" / "worker"
    worker.mkdir(parents=True)
    for package in (tmp_path / "vllm", tmp_path / "vllm" / "v1", worker):
        (package / "__init__.py").write_text("")
    if v1_there:
        (worker / "gpu_model_runner.py").write_text("")
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _helpers(after_sp022)["_model_runner_advice"]().startswith(advice)
