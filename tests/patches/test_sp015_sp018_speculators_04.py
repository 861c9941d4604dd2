"""Before/after pairs for the speculators 0.4.x codemods (SP015-SP018): rewrite, no-op, refusal.

The sources are the shapes of speculators 0.4.0.1's
data_generation/vllm_hidden_states_generator.py (byte-identical in 0.4.0), cut down; the
whole real file is covered by test_registry.py.
"""

from __future__ import annotations

import zipfile

import pytest
from codemods import noop_test, refusal_test, rewrite_test

from patcher.fixes.registry import loaded

GENERATOR = "speculators/data_generation/vllm_hidden_states_generator.py"

STEP_LOOP = """\
    while (
        scheduler_output := self.scheduler.schedule()
    ).total_num_scheduled_tokens > 0 and not all_prefill_complete:
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request_num_computed[req_id] += num_tokens
        model_output = self.executor.execute_model(scheduler_output)
        self.executor.sample_tokens(model_output)

    # Abort all requests (prefill complete, don't need decode)
    self.scheduler.finish_requests(list(request_id_to_idx.keys()), RequestStatus.FINISHED_ABORTED)
"""
FINISHED_IN_LOOP = """\
    while (
        scheduler_output := self.scheduler.schedule()
    ).total_num_scheduled_tokens > 0 and not all_prefill_complete:
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request_num_computed[req_id] += num_tokens
        model_output = self.executor.execute_model(scheduler_output)
        self.executor.sample_tokens(model_output)

        # Finish the requests whose whole prompt has now run: they free their slot
        # (max_num_seqs) and KV blocks for the prompts still waiting.
        self.scheduler.finish_requests(
            [
                req_id
                for req_id in scheduler_output.num_scheduled_tokens
                if request_num_computed[req_id] >= request_id_to_prompt_len[req_id]
            ],
            RequestStatus.FINISHED_ABORTED,
        )

    # Abort all requests (prefill complete, don't need decode)
    self.scheduler.finish_requests(list(request_id_to_idx.keys()), RequestStatus.FINISHED_ABORTED)
"""

REWRITES = [
    pytest.param(
        "SP015",
        """\
        free_memory, _ = mem_get_info()
        cache_memory = int(free_memory * gpu_memory_utilization * CACHE_MEMORY_FRACTION)
        """,
        """\
        free_memory = min(self.executor.determine_available_memory())  # bytes, any platform
        cache_memory = int(free_memory * gpu_memory_utilization * CACHE_MEMORY_FRACTION)
        """,
        id="SP015 executor answers for every platform",
    ),
    pytest.param(
        "SP016",
        """\
        # Map results back to original input order
        for req_id in sorted(request_id_to_idx.keys()):
            i = request_id_to_idx[req_id]
        """,
        """\
        # Map results back to original input order
        for req_id in sorted(request_id_to_idx, key=request_id_to_idx.get):
            i = request_id_to_idx[req_id]
        """,
        id="SP016 sorted by input index, comment kept",
    ),
    pytest.param(
        "SP017",
        "def generate(self):\n" + STEP_LOOP,
        "def generate(self):\n" + FINISHED_IN_LOOP,
        id="SP017 finish completed prompts at the end of each step",
    ),
    pytest.param(
        "SP018",
        """\
        from vllm.v1.request import Request, RequestStatus

        req = Request(
            request_id=req_id,
            pooling_params=None,
            eos_token_id=self.tokenizer.eos_token_id,
            arrival_time=INITIAL_ARRIVAL_TIME,
        )
        """,
        """\
        from vllm.v1.request import Request, RequestStatus
        import inspect

        # vLLM <= 0.16 requires Request(eos_token_id=); 0.17 removed it. Read once, at import.
        _REQUEST_TAKES_EOS_TOKEN_ID = "eos_token_id" in inspect.signature(Request.__init__).parameters

        req = Request(
            request_id=req_id,
            pooling_params=None,
            **({"eos_token_id": self.tokenizer.eos_token_id} if _REQUEST_TAKES_EOS_TOKEN_ID else {}),
            arrival_time=INITIAL_ARRIVAL_TIME,
        )
        """,
        id="SP018 SP013's portable keyword on 0.4.x's call",
    ),
]

NOOPS = [
    pytest.param(
        "SP015", "free_memory = min(self.executor.determine_available_memory())\n", id="SP015 already asks the executor"
    ),
    pytest.param(
        "SP016",
        "for req_id in sorted(request_id_to_idx, key=request_id_to_idx.__getitem__):\n    pass\n",
        id="SP016 already keyed by input index",
    ),
    pytest.param("SP017", "def generate(self):\n" + FINISHED_IN_LOOP, id="SP017 loop already finishes requests"),
    pytest.param("SP018", "req = Request(request_id=r, arrival_time=t)\n", id="SP018 no eos_token_id passed"),
]

REFUSALS = [
    pytest.param(
        "SP015",
        "free_memory, _ = torch.cuda.mem_get_info()\n",
        "'free_memory, _ = mem_get_info()'",
        id="SP015 another query (0.3.0's is SP011's)",
    ),
    pytest.param(
        "SP016",
        "for req_id in request_ids:\n    pass\n",
        "sorted(request_id_to_idx.keys())",
        id="SP016 results loop of another shape",
    ),
    pytest.param(
        "SP017",
        "while True:\n    self.executor.execute_model(scheduler_output)\n",
        "self.scheduler.schedule()",
        id="SP017 no scheduler loop",
    ),
    pytest.param(
        "SP017",
        "def generate(self):\n" + STEP_LOOP + "\ndef again(self):\n" + STEP_LOOP,
        "one 'while (scheduler_output",
        id="SP017 two step loops: which one?",
    ),
    pytest.param(
        "SP018",
        """\
        from vllm.v1.request import Request

        _REQUEST_TAKES_EOS_TOKEN_ID = True
        req = Request(request_id=req_id, eos_token_id=self.tokenizer.eos_token_id)
        """,
        "no module-level _REQUEST_TAKES_EOS_TOKEN_ID",
        id="SP018 its flag set by hand",
    ),
]


test_speculators_04_fix = rewrite_test(REWRITES)


test_speculators_04_fix_noop = noop_test(NOOPS)


test_speculators_04_fix_refuses_unknown_code = refusal_test(REFUSALS)


def test_both_releases_ship_the_same_data_generation_files():
    """0.4.0 and 0.4.0.1 share their data_generation/ files byte for byte (so one set of
    codemods, written against either, is right for both)."""
    from sandbox import wheel

    def files(version):
        with zipfile.ZipFile(wheel("speculators", version)) as z:
            return {n: z.read(n) for n in z.namelist() if n.startswith("speculators/data_generation/")}

    assert files("0.4.0") == files("0.4.0.1") and GENERATOR in files("0.4.0")


def test_each_release_gets_only_its_own_patches():
    from patcher.engine import written_for

    ids = {p.id for p in written_for("0.4.0.1", loaded().patches)}
    assert {"SP015", "SP016", "SP017", "SP018"} <= ids and not {"SP011", "SP013"} & ids
    assert not {"SP015", "SP016", "SP017", "SP018"} & {p.id for p in written_for("0.3.0", loaded().patches)}
    assert written_for("0.5.0", loaded().patches) == written_for("0.2.0", loaded().patches) == ()
