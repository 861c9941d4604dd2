"""verify's check of speculators' training half against transformers and torch
(``patcher.checks.library_calls``), on sandboxes built from the real wheels: transformers
installed without dependencies, torch's Python files unpacked from its wheel (no binaries).

No mocks: every finding below is what the real speculators 0.3.0 code meets in the real
library files, and each expected ``file:line`` on the library side is looked up in those
files by the test itself.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
from sandbox import make_sandbox, site_packages
from support import run_cli, run_json

from patcher.agent.pysource import bindings, slim
from patcher.agent.sources import _Reads, libraries
from patcher.checks import library_calls

# The +cpu torch the vLLM 0.27-0.32 CPU engines pin; its wheel is on the local index.
TORCH = "2.13.0+cpu"


def _sandbox(tmp_path: Path, transformers: str | None) -> Path:
    return make_sandbox(tmp_path / "env", transformers=transformers, torch_sources=TORCH, link=True)


def _unwrapped(text: str) -> str:
    """Report text with the console's wrapping undone (it prints 120 columns off a terminal)."""
    return text.replace("\n", " ")


def _library_findings(report: dict) -> list[dict]:
    return [f for f in report["calls"]["findings"] if f["library"] != "vLLM"]


def _line_of(path: Path, pattern: str) -> int:
    """The 1-based line of the first match of ``pattern`` in ``path``, read independently of the tool."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if re.search(pattern, line):
            return number
    raise AssertionError(f"{pattern!r} not in {path}")


def _replace(path: Path, old: str, new: str) -> None:
    """Edit a file by writing a new one and renaming it over the old: sandbox copies hard-link
    the library files to a cached template (``clone_site``), which must never change."""
    text = path.read_text(encoding="utf-8")
    assert old in text, (path, old)
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text.replace(old, new, 1), encoding="utf-8")
    os.replace(tmp, path)


@pytest.mark.parametrize("transformers", ["4.57.6", "5.22.2"])
def test_supported_stacks_every_training_call_fits(tmp_path, transformers):
    """transformers 4.57.6 (vLLM 0.16's) and 5.22.2 (vLLM 0.34's), each with torch 2.13:
    after apply, every call of the training half fits, and verify names all three libraries."""
    env = _sandbox(tmp_path, transformers)
    assert run_cli("apply", "--target", str(env)).returncode in (0, 3)
    code, report = run_json("verify", "--target", str(env))
    assert code in (0, 3), report["summary"]
    assert _library_findings(report) == []
    libs = report["calls"]["libraries"]
    assert libs["transformers"]["version"] == transformers and libs["torch"]["version"] == TORCH
    assert libs["vLLM"]["version"] == "0.16.0"
    # every import and call of the training half was read, not skipped
    assert libs["transformers"]["checked"] > 40 and libs["torch"]["checked"] > 60
    assert report["calls"]["checked"] == sum(v["checked"] for v in libs.values())
    text = _unwrapped(run_cli("verify", "--target", str(env)).stdout)
    title = re.search(r"calls from speculators into [^:]*: every call fits", text)
    assert title is not None, text
    assert title.group(0).startswith(
        f"calls from speculators into vLLM 0.16.0, transformers {transformers}, torch {TORCH} ("
    ), title.group(0)


def test_transformers_4_53_lacks_what_the_eagle3_draft_uses(tmp_path):
    """transformers 4.53.3 has no ``TransformersKwargs`` in transformers.utils.generic and its
    ``DynamicCache.__init__`` takes no ``config``: both of speculators' uses are breaks, each
    with speculators' file:line and the library's, and verify fails (exit 1) on the calls."""
    env = _sandbox(tmp_path, "4.53.3")
    site = site_packages(env)
    run_cli("apply", "--target", str(env))
    code, report = run_json("verify", "--target", str(env))
    assert code == 1 and "the calls" in report["failing"]
    found = {
        (f["kind"], f["file"], f["line"], f["subject"], f["library"], f["callee_file"], f["callee_line"])
        for f in _library_findings(report)
    }
    core = site / "speculators/models/eagle3/core.py"
    definitions = site / "speculators/models/eagle3/model_definitions.py"
    cache_utils = site / "transformers/cache_utils.py"
    init_line = _line_of(cache_utils, r"^class DynamicCache\b")
    init_line = init_line + _line_of_after(cache_utils, init_line, r"def __init__\(")
    assert found == {
        (
            "unknown-keyword",
            "speculators/models/eagle3/core.py",
            _line_of(core, r"DynamicCache\(config="),
            "config",
            "transformers",
            "transformers/cache_utils.py",
            init_line,
        ),
        (
            "missing-import",
            "speculators/models/eagle3/model_definitions.py",
            _line_of(definitions, r"import TransformersKwargs"),
            "TransformersKwargs",
            "transformers",
            "transformers/utils/generic.py",
            None,
        ),
    }
    assert report["calls"]["libraries"]["transformers"]["breaks"] == 2


def _line_of_after(path: Path, start: int, pattern: str) -> int:
    """Lines after line ``start`` to the first match of ``pattern``."""
    lines = path.read_text(encoding="utf-8").splitlines()[start:]
    return next(i for i, line in enumerate(lines) if re.search(pattern, line)) + 1


def test_an_edited_training_call_is_reported_with_both_lines(tmp_path):
    """Calls speculators' training half could make wrong, one per kind and library: an
    unknown keyword to a transformers class, an unknown keyword to a torch.distributed
    function called through its module alias, too many positional arguments to
    torch.nn.functional.pad. The text report names each with both file:lines."""
    env = _sandbox(tmp_path, "4.57.6")
    site = site_packages(env)
    core = site / "speculators/models/eagle3/core.py"
    checkpointer = site / "speculators/train/checkpointer.py"
    data = site / "speculators/train/data.py"
    _replace(core, "DynamicCache(config=self.config.transformer_layer_config)", "DynamicCache(config=None, size=3)")
    _replace(checkpointer, "        dist.barrier()\n", "        dist.barrier(wait_all=True)\n")
    _replace(data, "F.pad(sliced_tensor, padding)", 'F.pad(sliced_tensor, padding, "constant", 0.0, 1)')
    code, report = run_json("verify", "--target", str(env))
    assert code == 1
    found = {
        (f["kind"], f["file"], f["line"], f["library"], f["callee_file"], f["callee_line"])
        for f in _library_findings(report)
    }
    c10d, functional = site / "torch/distributed/distributed_c10d.py", site / "torch/nn/functional.py"
    assert found == {
        (
            "unknown-keyword",
            "speculators/models/eagle3/core.py",
            _line_of(core, r"DynamicCache\(config=None, size=3\)"),
            "transformers",
            "transformers/cache_utils.py",
            _line_of(site / "transformers/cache_utils.py", r"^class DynamicCache\b")
            + _line_of_after(
                site / "transformers/cache_utils.py",
                _line_of(site / "transformers/cache_utils.py", r"^class DynamicCache\b"),
                r"def __init__\(",
            ),
        ),
        (
            "unknown-keyword",
            "speculators/train/checkpointer.py",
            _line_of(checkpointer, r"dist\.barrier\(wait_all=True\)"),
            "torch",
            "torch/distributed/distributed_c10d.py",
            _line_of(c10d, r"^def barrier\("),
        ),
        (
            "too-many-positional",
            "speculators/train/data.py",
            _line_of(data, r"F\.pad\(sliced_tensor, padding, "),
            "torch",
            "torch/nn/functional.py",
            _line_of(functional, r"^def pad\("),
        ),
    }
    text = _unwrapped(run_cli("verify", "--target", str(env)).stdout)
    barrier, callee = _line_of(checkpointer, r"dist\.barrier\(wait_all=True\)"), _line_of(c10d, r"^def barrier\(")
    said = (
        f"break speculators/train/checkpointer.py:{barrier}: dist.barrier(...): dist.barrier takes no keyword wait_all"
    )
    assert said in text
    assert f" torch torch/distributed/distributed_c10d.py:{callee}: dist.barrier(" in text


def test_a_changed_library_file_is_read_again(tmp_path):
    """The calls cache keys on the library files too: after a verify, a transformers file
    changed in place of the old one (here ``DynamicCache.__init__`` losing ``config``) is
    read again and the call that no longer fits is reported."""
    env = _sandbox(tmp_path, "4.57.6")
    site = site_packages(env)
    code, report = run_json("verify", "--target", str(env))
    assert _library_findings(report) == []
    code, again = run_json("verify", "--target", str(env))  # answered from the cache
    assert _library_findings(again) == [] and again["calls"]["libraries"] == report["calls"]["libraries"]
    cache_utils = site / "transformers/cache_utils.py"
    text = cache_utils.read_text(encoding="utf-8")
    start = text.index("class DynamicCache(")
    old = "        config: Optional[PretrainedConfig] = None,\n"
    at = text.index(old, start)
    tmp = cache_utils.with_name("cache_utils.py.new")
    tmp.write_text(text[:at] + old.replace("config:", "model_config:") + text[at + len(old) :], encoding="utf-8")
    os.replace(tmp, cache_utils)
    code, report = run_json("verify", "--target", str(env))
    assert code == 1
    assert [(f["kind"], f["subject"], f["callee_file"]) for f in _library_findings(report)] == [
        ("unknown-keyword", "config", "transformers/cache_utils.py")
    ]


def test_no_library_installed_says_so(sandbox):
    """The bare sandbox (no transformers, no torch): nothing of theirs is checked, and the
    report says so rather than claiming the training half's calls fit."""
    code, report = run_json("verify", "--target", str(sandbox))
    libs = report["calls"]["libraries"]
    assert libs["transformers"] == {"version": None, "checked": 0, "breaks": 0, "notes": 0}
    assert libs["torch"] == {"version": None, "checked": 0, "breaks": 0, "notes": 0}
    text = _unwrapped(run_cli("verify", "--target", str(sandbox)).stdout)
    assert "static; transformers and torch not installed, not checked)" in text


def test_the_agent_reads_only_what_the_training_half_reaches(tmp_path):
    """The agent's ``libraries`` answer: the library files the resolver needs, not the
    libraries (transformers has some 2,000 files, torch's Python half some 4,000), each sent
    with its function bodies elided (``slim``) yet with every line where it was, every
    name still bound, and parsing."""
    env = _sandbox(tmp_path, "4.57.6")
    site = str(site_packages(env))
    roots = {"speculators": site, "vllm": site, "transformers": site, "torch": site}
    reads = _Reads(roots)
    answer = libraries(library_calls.request(), reads, roots)
    training, files = library_calls.decode({"libraries": answer})
    assert "speculators/train/trainer.py" in training and "speculators/config.py" in training
    sent = {p: d for p, d in files.items() if d is not None}
    assert 60 < len(sent) < 300, len(sent)
    assert sum(map(len, sent.values())) < 2_500_000
    models = {p.split("/")[2] for p in sent if p.startswith("transformers/models/") and p.count("/") > 2}
    assert models == {"auto", "llama"}  # of some 400 model packages, the two the draft uses
    for path, data in sent.items():
        original = Path(site, path).read_bytes()
        assert data == slim(original)
        assert data.count(b"\n") == original.count(b"\n"), path
        module = path[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        is_pkg = path.endswith("__init__.py")
        before, after = ast.parse(original), ast.parse(data)
        assert set(bindings(after, module, is_pkg)[0]) == set(bindings(before, module, is_pkg)[0]), path
        lines = [(n.name, n.lineno) for n in before.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
        assert lines == [(n.name, n.lineno) for n in after.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
    # the record the calls cache keys on names every library file read
    record = {name.partition(":")[2] for name in reads.as_dict()["files"]}
    assert set(files) <= record


LAYER = """\
from typing import overload

from .utils import deprecate_kwarg


class Layer:
    def __init__(self, size, *, bias=True): ...

    @overload
    def to(self, device): ...
    @overload
    def to(self, dtype, copy): ...
    def to(self, *args, **kwargs): ...

    @classmethod
    @deprecate_kwarg("past_key_value", new_name="past_key_values", version="4.58")
    def build(cls, past_key_values=None): ...


@deprecate_kwarg("cache", new_name="caches", version="5.0")
def build(caches=None): ...
"""

TRAINING = """\
import transformers.layer as tl
from transformers import Layer, build


class Mine(Layer):
    def __init__(self):
        super().__init__(4, bias=False, extra=1)


Layer.to(None, "cpu", True, False)
Layer.build(past_key_value=1)
Layer.build(nope=1)
build(cache=1)
build(other=1)
Layer(1, 2)
tl.build(other=2)
"""


@pytest.mark.fast
def test_calls_read_as_they_run():
    """On small synthetic library sources, each call is judged as Python would run it: the
    last definition of an overloaded method, keywords a ``@deprecate_kwarg`` decorator still
    renames (transformers' own), a class method, ``super().__init__`` of a library base, a
    function through an imported module alias."""
    files = {
        "transformers/__init__.py": b"from .layer import Layer, build\n",
        "transformers/layer.py": LAYER.encode(),
        "transformers/utils.py": b"def deprecate_kwarg(old_name, version, new_name=None):\n    return lambda f: f\n",
    }
    training = {"speculators/train/x.py": TRAINING.encode()}
    record: list = []
    found = library_calls.check(training, {p: slim(d) for p, d in files.items()}, record, installed=("transformers",))
    assert {(f.kind, f.line, f.subject, f.vllm_file, f.library) for f in found} == {
        ("unknown-keyword", 7, "extra", "transformers/layer.py", "transformers"),
        ("unknown-keyword", 12, "nope", "transformers/layer.py", "transformers"),
        ("unknown-keyword", 14, "other", "transformers/layer.py", "transformers"),
        ("too-many-positional", 15, "2", "transformers/layer.py", "transformers"),
        ("unknown-keyword", 16, "other", "transformers/layer.py", "transformers"),
    }
    assert {c.line for c in record if c.call is not None} == {7, 10, 11, 12, 13, 14, 15, 16}


@pytest.mark.fast
def test_a_name_only_compiled_code_binds_is_not_a_break():
    """torch/__init__.py star-imports its compiled extension (``from torch._C import *``):
    a name not found in torch's Python files may be bound there, so importing it is no
    finding; a module without such a star import is judged as usual."""
    files = {
        "torch/__init__.py": b"from torch._C import *\nfrom torch import nn as nn\n",
        "torch/nn/__init__.py": b"class Linear:\n    def __init__(self, n): ...\n",
    }
    training = {"speculators/train/x.py": b"from torch import float32\nfrom torch.nn import Linear, Conv9d\n"}
    found = library_calls.check(training, files, [], installed=("torch",))
    assert [(f.kind, f.line, f.subject, f.vllm_file) for f in found] == [
        ("missing-import", 2, "Conv9d", "torch/nn/__init__.py")
    ]
