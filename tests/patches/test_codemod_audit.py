"""Issue 30: every shipped codemod (SP001-SP029) on the real speculators files it is written
for -- a rewrite, a no-op once satisfied, and a refusal of a hand-edited variant of what it
touches, named by file:line, instead of a guess (SP006 used to drop unique_reply_rank=1,
reading rank 0's reply). Each patch runs on the real file of its release with the patches
ordered before it on that file already applied, as ``apply`` runs them. The bytes each
rewrite emits are pinned (sha256 prefix), so tightening what a codemod accepts never changes
what it writes."""

from __future__ import annotations

import hashlib
import zipfile
from functools import lru_cache

import pytest
from sandbox import wheel

from patcher.engine import run_codemod
from patcher.fixes.registry import shipped_patches

AUDITED = [f"SP{n:03d}" for n in range(1, 30)]
BY_ID = {p.id: p for p in shipped_patches()}
RELEASE = {pid: "0.4.0.1" if pid in ("SP015", "SP016", "SP017", "SP018") else "0.3.0" for pid in AUDITED}

# sha256 (first 16 hex) of the file each patch writes from its base (below). A patch added before
# another on the same file changes the later one's base, and so its value (SP026 before SP023/SP024).
EMITTED = {
    "SP001": "7e1f3c08881bca45",
    "SP002": "9ce97b7e2f2128b5",
    "SP003": "71c39785f7e4b4d2",
    "SP004": "9fc3bf9c4f681b0e",
    "SP005": "f4eadbc9a8b88bd2",
    "SP006": "d188e231c565705a",
    "SP007": "6921b18a139c56e0",
    "SP008": "49c20bce09960d03",
    "SP009": "afbc895ec2b24c2d",
    "SP010": "e577012ee08ca634",
    "SP011": "df4e7f6c69a18bf6",
    "SP012": "bbd10d7252d1c9ad",
    "SP013": "2493ede8fdaa04ce",
    "SP014": "80382ba3a7889696",
    "SP015": "a625a4737d3327d2",
    "SP016": "608572b682904f29",
    "SP017": "e499a155e0dc6a8c",
    "SP018": "da0400d23316774e",
    "SP019": "957b175cc541d686",
    "SP020": "5c40f21fbc2fc7c5",
    "SP021": "db8bddd68b79c331",
    "SP022": "26eefd45e0605c8b",
    "SP023": "d1299fccd3c07686",
    "SP024": "84f6df9edbdb47f2",
    "SP025": "34ecaf546397031a",
    "SP026": "fd7b4747b39ebef7",
    "SP027": "cb371f1c7396a99d",
    "SP028": "d8f1d541ba379e45",
    "SP029": "99985a8bb8f65151",
}


@lru_cache(maxsize=None)
def base(pid: str) -> bytes:
    """The file ``pid`` rewrites, from its release's wheel, with the audited patches ordered
    before it on that file applied in order."""
    patch = BY_ID[pid]
    with zipfile.ZipFile(wheel("speculators", RELEASE[pid])) as z:
        source = z.read(patch.file)
    for earlier in sorted(
        (BY_ID[p] for p in AUDITED if RELEASE[p] == RELEASE[pid] and BY_ID[p].file == patch.file),
        key=lambda p: (p.order, p.id),
    ):
        if (earlier.order, earlier.id) >= (patch.order, patch.id):
            break
        verdict, source, _ = run_codemod(earlier, source)
        assert verdict == "changed", (pid, earlier.id)
    return source


ON_RELEASE = [pytest.param(pid, id=pid) for pid in AUDITED]  # rewrite, then no-op on what it wrote

# (patch, text in its base, the hand edit, the line the refusal must name, what it says it expected)
HAND_EDITS = [
    pytest.param(
        "SP001",
        "scheduler_config=SchedulerConfig(\n",
        "scheduler_config=SchedulerConfig(\n                **extra,\n",
        "**extra,",
        "without **kwargs",
        id="SP001 a **mapping may carry is_encoder_decoder",
    ),
    pytest.param(
        "SP002",
        "kv_cache_specs=kv_cache_spec,",
        '**{"kv_cache_specs": kv_cache_spec},',
        "**{",
        "without **kwargs",
        id="SP002 the keyword in a **mapping",
    ),
    pytest.param(
        "SP003",
        "structured_output_manager=structured_output_manager,\n",
        "structured_output_manager=structured_output_manager,\n            **scheduler_kwargs,\n",
        "**scheduler_kwargs,",
        "without **kwargs",
        id="SP003 a **mapping may carry block_size",
    ),
    pytest.param(
        "SP004",
        "block_size=VLLM_BLOCK_SIZE,\n",
        "block_size=VLLM_BLOCK_SIZE,\n            enable_prefix_caching=prefix_caching,\n",
        "enable_prefix_caching=prefix_caching,",
        "found prefix_caching",
        id="SP004 prefix caching set by a variable",
    ),
    pytest.param(
        "SP005",
        "self.executor.execute_model(scheduler_output)\n",
        "self.executor.execute_model(scheduler_output, non_block=True)\n",
        "non_block=True",
        "a statement self.executor.execute_model(scheduler_output)",
        id="SP005 another argument is not dropped",
    ),
    pytest.param(
        "SP006",
        "unique_reply_rank=0,",
        "unique_reply_rank=1,",
        "unique_reply_rank=1,",
        "found 1",
        id="SP006 rank 1's reply is not turned into rank 0's",
    ),
    pytest.param(
        "SP007",
        "else self.get_input_embeddings(input_ids)",
        "else self.get_input_embeddings(input_ids, extra)",
        "get_input_embeddings(input_ids, extra)",
        "one positional argument",
        id="SP007 another argument",
    ),
    pytest.param(
        "SP008",
        "if not supports_eagle3(model):",
        "if not supports_eagle3(self.model_runner.model):",
        "if not supports_eagle3(",
        "one 'if not supports_eagle3(model)",
        id="SP008 the gate on another model",
    ),
    pytest.param(
        "SP009",
        "self._captured_states[i].append(h)\n",
        "self._captured_states[i].append(h.cpu())\n",
        "def _store_captured_states",
        "_store_captured_states, unedited",
        id="SP009 a hand edit in the storage",
    ),
    pytest.param(
        "SP010",
        'raise RuntimeError(\n                "Must call',
        'self._batch_layouts = []\n            raise RuntimeError(\n                "Must call',
        "self._batch_layouts = []",
        "no _track_batch_layout or self._batch_layouts",
        id="SP010 its name taken",
    ),
    pytest.param(
        "SP011",
        "free_memory, _ = torch.cuda.mem_get_info()",
        "free_memory, total_memory = torch.cuda.mem_get_info()",
        "total_memory",
        "'free_memory, _ = torch.cuda.mem_get_info()'",
        id="SP011 the total is not dropped",
    ),
    pytest.param(
        "SP012",
        "finish_requests([req_id], RequestStatus.FINISHED_ABORTED)",
        "finish_requests([req_id], RequestStatus.FINISHED_STOPPED)",
        "for req_id in scheduler_output",
        "'for req_id in scheduler_output.num_scheduled_tokens:",
        id="SP012 another finish status",
    ),
    pytest.param(
        "SP013",
        "CACHE_MEMORY_FRACTION = 0.2",
        "_REQUEST_TAKES_EOS_TOKEN_ID = True\nCACHE_MEMORY_FRACTION = 0.2",
        None,
        "no module-level _REQUEST_TAKES_EOS_TOKEN_ID",
        id="SP013 its flag set by hand",
    ),
    pytest.param(
        "SP014",
        "from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask\n",
        "try:\n    from transformers.modeling_attn_mask_utils import _prepare_4d_causal_attention_mask\n"
        "except ImportError:\n    pass\n",
        "try:",
        "'except ImportError:' that defines",
        id="SP014 a guard without the function is not satisfied",
    ),
    pytest.param(
        "SP015",
        "free_memory, _ = mem_get_info()",
        "free_memory, total = mem_get_info()",
        "free_memory, total",
        "'free_memory, _ = mem_get_info()'",
        id="SP015 the total is not dropped",
    ),
    pytest.param(
        "SP016",
        "sorted(request_id_to_idx.keys())",
        "sorted(request_id_to_idx.keys(), reverse=True)",
        "reverse=True",
        "'sorted(request_id_to_idx.keys())'",
        id="SP016 another sort order",
    ),
    pytest.param(
        "SP017",
        "                request_num_computed[req_id] += num_tokens\n",
        "                request_num_computed[req_id] += num_tokens\n"
        "                self.scheduler.finish_requests([req_id], RequestStatus.FINISHED_STOPPED)\n",
        "FINISHED_STOPPED",
        "no finish_requests in the step loop but the one",
        id="SP017 a finish of its own in the loop",
    ),
    pytest.param(
        "SP018",
        "VLLM_BLOCK_SIZE = ",
        "_REQUEST_TAKES_EOS_TOKEN_ID = True\nVLLM_BLOCK_SIZE = ",
        None,
        "no module-level _REQUEST_TAKES_EOS_TOKEN_ID",
        id="SP018 its flag set by hand",
    ),
    pytest.param(
        "SP019",
        "cls.model_rebuild(force=True)",
        "cls.model_rebuild(force=True, raise_errors=False)",
        "raise_errors=False",
        "'cls.model_rebuild(force=True)'",
        id="SP019 another rebuild",
    ),
    pytest.param(
        "SP020",
        'self.executor.collective_rpc("get_kv_cache_spec")',
        'self.executor.collective_rpc("get_kv_cache_spec", timeout=60)',
        "timeout=60",
        "kv_cache_spec_list = self.executor.collective_rpc",
        id="SP020 the specs read another way",
    ),
    pytest.param(
        "SP021",
        "block_size=VLLM_BLOCK_SIZE,",
        "block_size=2 * VLLM_BLOCK_SIZE,",
        None,
        "one CacheConfig(block_size=VLLM_BLOCK_SIZE)",
        id="SP021 another block size",
    ),
    pytest.param(
        "SP022",
        'raise RuntimeError(f"Scheduled requests not in the batch: {missing}")',
        'logger.warning(f"Scheduled requests not in the batch: {missing}")',
        "def _track_batch_layout",
        "SP010's _track_batch_layout, unedited",
        id="SP022 SP010's method edited",
    ),
    pytest.param(
        "SP023",
        "    unify_hybrid_kv_cache_specs,\n",
        "    unify_hybrid_kv_cache_specs as unify_specs,\n",
        "from vllm.v1.core.kv_cache_utils import",
        "'from vllm.v1.core.kv_cache_utils import",
        id="SP023 an import it does not know",
    ),
    pytest.param(
        "SP024",
        "self.executor.set_kv_cache_layout(layout.name)",
        "self.executor.set_kv_cache_layout(layout.name.upper())",
        None,
        "SP020's KV cache layout block in the generator, unedited",
        id="SP024 SP020's block edited",
    ),
    pytest.param(
        "SP025",
        "        # Get captured states from driver worker\n",
        "        if scheduler_output.finished_req_ids:\n            pass\n\n        # Get captured states from driver worker\n",
        "if scheduler_output.finished_req_ids:",
        "'if scheduler_output.finished_req_ids:' with nothing but",
        id="SP025 a flush that sends nothing is not satisfied",
    ),
    pytest.param(
        "SP026",
        "enable_prefix_caching=False,\n",
        "enable_prefix_caching=False,\n            enable_extensible_kv_cache=True,\n",
        "enable_extensible_kv_cache=True",
        "no enable_extensible_kv_cache= of its own",
        id="SP026 a switch the user set is kept, not overridden",
    ),
    pytest.param(
        "SP027",
        'v2 = type(runner).__module__.startswith("vllm.v1.worker.gpu.")',
        "v2 = True",
        "def _track_batch_layout",
        "SP022's _track_batch_layout, unedited",
        id="SP027 an edited SP022 method",
    ),
    pytest.param(
        "SP028",
        "    def _get_captured_states_per_request(self):\n",
        "    def _staged_captures(self):\n        return []\n\n    def _get_captured_states_per_request(self):\n",
        "def _staged_captures",
        "of its own",
        id="SP028 a method of the user's by a name it adds",
    ),
    pytest.param(
        "SP029",
        "aux_hidden_states = captured_states_list[0]",
        "aux_hidden_states = captured_states_list[1]",
        None,
        "'aux_hidden_states = captured_states_list[0]'",
        id="SP029 another rank's reply read",
    ),
]


@pytest.mark.parametrize("pid", ON_RELEASE)
def test_rewrite(pid):
    verdict, new, _ = run_codemod(BY_ID[pid], base(pid))
    assert verdict == "changed" and new != base(pid)
    assert hashlib.sha256(new).hexdigest()[:16] == EMITTED[pid], "the emitted code changed: bump the patch's version"
    compile(new, BY_ID[pid].file, "exec")


@pytest.mark.parametrize("pid", ON_RELEASE)
def test_noop_once_satisfied(pid):
    _, new, _ = run_codemod(BY_ID[pid], base(pid))
    verdict, again, detail = run_codemod(BY_ID[pid], new)
    assert (verdict, again) == ("satisfied", new) and detail.startswith("already satisfied")


@pytest.mark.parametrize(("pid", "old", "new", "line", "expected"), HAND_EDITS)
def test_a_hand_edited_variant_is_refused_by_file_and_line(pid, old, new, line, expected):
    source = base(pid).decode()
    assert source.count(old) == 1, f"{pid}: the text to edit is not once in its base"
    edited = source.replace(old, new).encode()
    verdict, after, detail = run_codemod(BY_ID[pid], edited)
    assert (verdict, after) == ("refused", edited), detail
    where = BY_ID[pid].file
    if line is not None:
        where += f":{next(n for n, text in enumerate(edited.decode().splitlines(), 1) if line in text)}"
    assert detail.startswith(f"{where}: unrecognised code, expected "), detail
    assert expected in detail, detail


@pytest.mark.fast
def test_every_audited_patch_has_its_triple():
    refused = {p.values[0] for p in HAND_EDITS}
    assert refused == set(AUDITED) == {p.values[0] for p in ON_RELEASE} == set(EMITTED)
    assert set(AUDITED) <= set(BY_ID)


def test_diff_refuses_a_hand_edit_by_patch_and_line(sandbox, site):
    """Issue 30 item 5, as a user meets it: unique_reply_rank=1 set in the generator; diff
    --only SP006 used to drop it silently (rank 0's reply then read)."""
    from support import GENERATOR, run_cli, tree_digest

    path = site / GENERATOR
    text = path.read_text()
    assert text.count("unique_reply_rank=0,") == 1
    path.write_text(text.replace("unique_reply_rank=0,", "unique_reply_rank=1,"))
    line = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if "unique_reply_rank=1" in t)
    before = tree_digest(site)
    for command in ("diff", "apply"):
        result = run_cli(command, "--target", str(sandbox), "--only", "SP006")
        assert (result.returncode, result.stdout) == (2, ""), (command, result.stdout)
        assert result.stderr.startswith(f"error: {GENERATOR}:{line}: unrecognised code, expected unique_reply_rank= ")
        assert "(SP006 collective-rpc-reply-list; --skip SP006 leaves it out)" in result.stderr
        assert len(result.stderr.splitlines()) == 1 and tree_digest(site) == before
