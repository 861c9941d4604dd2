"""``verify --runtime`` machinery on a tiny fake install: the agent's ``sources`` and
``run_python`` ops, the probe in a child interpreter, and disagreement reporting."""

from __future__ import annotations

import textwrap
from pathlib import Path

from patcher.checks import callsite
from patcher.checks.runtime import runtime_verify
from patcher.connect.local import LocalTransport

GEN = """\
from vllm.kv import get_config, make_config
from vllm.gone import nothing_here

get_config(1, kv_cache_groups=2, available_memory=3, extra=4)
make_config(1, kv_cache_specs=2)
"""
KV = """\
def get_config(vllm_config, kv_cache_groups, available_memory):
    pass


def make_config(vllm_config, kv_cache_specs):
    pass


def _wider(vllm_config, kv_cache_groups=None, available_memory=0, extra=None):
    pass


# Rebinding at import time: only the live object shows it.
globals()["get_config"] = _wider
"""


def fake_site(root: Path) -> Path:
    files = {
        "speculators/__init__.py": "",
        "speculators/data_generation/__init__.py": "",
        "speculators/data_generation/gen.py": GEN,
        "vllm/__init__.py": "__version__ = '0.0.test'\n",
        "vllm/kv.py": KV,
        "vllm/gone.py": "something_else = 1\n",
        "vllm/v1/worker/gpu_worker.py": "class Worker:\n    pass\n",
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(text))
    for pkg in ("vllm/v1", "vllm/v1/worker"):
        (root / pkg / "__init__.py").touch()
    return root


def test_runtime_reading_reports_disagreements(tmp_path):
    site = str(fake_site(tmp_path / "site-packages"))
    with LocalTransport(site) as transport:
        speculators, vllm = callsite.fetch(transport, site)
        checked: list = []
        static = callsite.check(speculators, vllm, checked)
        report = runtime_verify(transport, site, checked, static, callsite.WORKER)
        assert transport.exchanges == 2  # sources + run_python
    assert {(f.kind, f.subject) for f in static} == {("missing-import", "nothing_here"), ("unknown-keyword", "extra")}
    assert report.vllm_version == "0.0.test"
    assert {(f.kind, f.subject) for f in report.findings} == {("missing-import", "nothing_here")}
    # The static reading of get_config is not what runs: both readings are shown.
    assert any("get_config" in d and "extra" in d for d in report.disagreements), report.disagreements
    assert any("kv_cache_groups is required in the source, optional live" in d for d in report.disagreements)
    assert any(
        "static reading reports unknown-keyword extra, the live objects do not" in d for d in report.disagreements
    )
