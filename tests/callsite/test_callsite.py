"""The generic call-site check on small synthetic vLLM sources: one case per finding kind."""

from __future__ import annotations

import textwrap

import pytest

from patcher.agent.pysource import collect_sources, speculators_vllm_imports
from patcher.checks.callsite import check

pytestmark = pytest.mark.fast

SPEC = "speculators/data_generation/gen.py"


def vllm_tree(files: dict[str, str]) -> dict[str, bytes | None]:
    """Files as the agent would return them for the speculators module's imports."""
    data = {p: textwrap.dedent(s).encode() for p, s in files.items()}
    return data


def run(spec_src: str, vllm_files: dict[str, str]) -> list[str]:
    vllm = vllm_tree(vllm_files)
    spec = {SPEC: textwrap.dedent(spec_src).encode()}
    import ast

    seeds = [("vllm.v1.worker.gpu_worker", "Worker"), *speculators_vllm_imports(ast.parse(spec[SPEC]))]
    fetched = collect_sources(vllm.get, seeds)
    return [f"{f.kind} {f.line} {f.vllm_where} {f.detail}" for f in check(spec, fetched)]


CONFIG = {
    "vllm/config/__init__.py": "from vllm.config.scheduler import SchedulerConfig\n",
    "vllm/config/utils.py": """\
        from pydantic import ConfigDict
        from pydantic.dataclasses import dataclass

        def config(cls):
            return dataclass(cls, config=ConfigDict(extra="forbid"))
        """,
    "vllm/config/scheduler.py": """\
        from dataclasses import InitVar, field
        from typing import ClassVar
        from vllm.config.utils import config

        @config
        class SchedulerConfig:
            max_num_seqs: int = 128
            max_model_len: InitVar[int]
            is_encoder_decoder: InitVar[bool]
            hidden: int = field(init=False)
            counter: ClassVar[int] = 0
        """,
}


@pytest.mark.parametrize(
    ("spec_src", "vllm_files", "expected"),
    [
        pytest.param(
            "from vllm.config import SchedulerConfig\nSchedulerConfig(max_num_seqs=1, max_model_len=2)\n",
            CONFIG,
            ["missing-argument 2 vllm/config/scheduler.py:9 required init-only field is_encoder_decoder not passed"],
            id="init-only field of a pydantic dataclass, through a re-export",
        ),
        pytest.param(
            "from vllm.config import SchedulerConfig\nSchedulerConfig(max_model_len=2, is_encoder_decoder=False, hidden=1)\n",
            CONFIG,
            ["unknown-keyword 2 vllm/config/scheduler.py:6 SchedulerConfig takes no keyword hidden"],
            id="field(init=False) is not a parameter",
        ),
        pytest.param(
            "from vllm.config import SchedulerConfig\nSchedulerConfig(max_model_len=2, is_encoder_decoder=False, counter=1)\n",
            {
                **CONFIG,
                "vllm/config/utils.py": "from pydantic.dataclasses import dataclass\n"
                "def config(cls):\n    return dataclass(cls)\n",
            },
            ["ignored-keyword 2 vllm/config/scheduler.py:6 SchedulerConfig has no field counter; pydantic drops it"],
            id="pydantic without extra=forbid ignores unknown keywords",
        ),
        pytest.param(
            "from vllm.kv import get_config\nget_config(1, kv_cache_specs=2, available_memory=3)\n",
            {"vllm/kv.py": "def get_config(vllm_config, kv_cache_groups, available_memory):\n    pass\n"},
            [
                "missing-argument 2 vllm/kv.py:1 required parameter kv_cache_groups not passed",
                "unknown-keyword 2 vllm/kv.py:1 get_config takes no keyword kv_cache_specs",
            ],
            id="function: removed keyword, required parameter",
        ),
        pytest.param(
            "from vllm.gone import thing\n",
            {"vllm/gone.py": "other = 1\n"},
            ["missing-import 1 vllm/gone.py vLLM has no thing in vllm.gone"],
            id="imported name no longer exists",
        ),
        pytest.param(
            "from vllm.sched import Scheduler\n"
            "class G:\n"
            "    def __init__(self):\n"
            "        self.s = Scheduler(1)\n"
            "        self.s.tick()\n"
            "        if hasattr(self.s, 'sample'):\n"
            "            self.s.sample(None)\n"
            "        self.s.sample(None)\n",
            {
                "vllm/sched.py": "from vllm.base import Base\nclass Scheduler(Base):\n    pass\n",
                "vllm/base.py": "class Base:\n    def __init__(self, block_size):\n        pass\n    def tick(self):\n        pass\n",
            },
            ["missing-method 8 vllm/sched.py:2 Scheduler (and its bases) has no method sample"],
            id="methods through base classes; hasattr guard",
        ),
        pytest.param(
            "from vllm.executor import Executor\n"
            "class G:\n"
            "    def __init__(self):\n"
            "        self.e = Executor()\n"
            "        self.e.collective_rpc('get_kv_cache_spec')\n"
            "        self.e.collective_rpc('_capture')\n"
            "        self.e.collective_rpc('_nowhere')\n"
            "        x = dict(worker_extension_cls='speculators.data_generation.gen.Ext')\n"
            "class Ext:\n"
            "    def _capture(self):\n"
            "        pass\n",
            {
                "vllm/executor.py": "class Executor:\n    def collective_rpc(self, method, args=()):\n        pass\n",
                "vllm/v1/worker/gpu_worker.py": "from vllm.v1.worker.worker_base import WorkerBase\nclass Worker(WorkerBase):\n    pass\n",
                "vllm/v1/worker/worker_base.py": "class WorkerBase:\n    def get_kv_cache_spec(self):\n        pass\n",
            },
            [
                "unknown-rpc 7 vllm/v1/worker/gpu_worker.py:2 neither Worker nor Ext "
                "(speculators/data_generation/gen.py:9) defines _nowhere"
            ],
            id="collective_rpc names: worker bases and the extension",
        ),
        pytest.param(
            "from vllm.sp import SamplingParams\nSamplingParams(max_tokens=1, temprature=0.0)\n",
            {
                "vllm/sp.py": "import msgspec\nclass SamplingParams(msgspec.Struct, omit_defaults=True):\n"
                "    max_tokens: int = 16\n    temperature: float = 1.0\n"
            },
            ["unknown-keyword 2 vllm/sp.py:2 SamplingParams takes no keyword temprature"],
            id="msgspec.Struct fields",
        ),
    ],
)
def test_callsite(spec_src: str, vllm_files: dict[str, str], expected: list[str]) -> None:
    assert run(spec_src, vllm_files) == expected


@pytest.mark.parametrize(
    ("spec_src", "vllm_files"),
    [
        pytest.param(
            "from vllm.config import SchedulerConfig\nSchedulerConfig(max_model_len=2, is_encoder_decoder=False)\n",
            CONFIG,
            id="all required passed",
        ),
        pytest.param(
            "from vllm.ext import Thing\nThing(1, 2, x=3)\n",
            {"vllm/ext.py": "import torch\nclass Thing(torch.nn.Module):\n    pass\n"},
            id="class with a base outside vLLM: unknown, no finding",
        ),
        pytest.param(
            "from vllm.kv import f\nf(*args, **kwargs)\n",
            {"vllm/kv.py": "def f(a, b):\n    pass\n"},
            id="splatted call",
        ),
        pytest.param(
            "from vllm.dist import get_pp_group\nget_pp_group()\n",
            {
                "vllm/dist/__init__.py": "from .state import *\n",
                "vllm/dist/state.py": "def get_pp_group():\n    pass\n",
            },
            id="star import",
        ),
    ],
)
def test_callsite_noop(spec_src: str, vllm_files: dict[str, str]) -> None:
    assert run(spec_src, vllm_files) == []


FALLBACK = (
    "try:\n"
    "    from vllm.old import get_config\n"
    "except ImportError:\n"
    "    from vllm.new import get_config\n"
    "get_config(1, 2, 3, kv_cache_specs=4)\n"
)
SIGNATURE = "def get_config(vllm_config, kv_cache_groups, available_memory):\n    pass\n"


@pytest.mark.parametrize(
    ("vllm_files", "expected"),
    [
        pytest.param(
            {"vllm/old.py": SIGNATURE},
            ["unknown-keyword 5 vllm/old.py:1 get_config takes no keyword kv_cache_specs"],
            id="the try body resolves: its import runs, the fallback's module need not exist",
        ),
        pytest.param(
            {"vllm/old.py": "other = 1\n", "vllm/new.py": SIGNATURE},
            ["unknown-keyword 5 vllm/new.py:1 get_config takes no keyword kv_cache_specs"],
            id="the try body does not resolve: the fallback's import runs, its signature is checked",
        ),
        pytest.param(
            {"vllm/old.py": "other = 1\n"},
            ["missing-import 4 vllm/new.py vLLM has no module vllm.new"],
            id="neither resolves: the fallback's import is the break",
        ),
    ],
)
def test_an_import_with_an_import_error_fallback_is_judged_as_it_runs(vllm_files, expected):
    assert run(FALLBACK, vllm_files) == expected


def test_callsite_unparsable_vllm_file_is_a_note_not_a_break():
    found = run("from vllm.new import f\nf()\n", {"vllm/new.py": "def f(:\n    pass\n"})
    assert found == ["unreadable 1  not checked: this Python cannot parse vllm/new.py (line 1: invalid syntax)"]
