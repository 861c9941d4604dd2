"""SP006: read the captured states from a list of replies, in every vLLM release.

vLLM >= 0.12 (vllm/v1/executor/multiproc_executor.py, MultiprocExecutor.collective_rpc)
returns the single reply of rank r when called with `unique_reply_rank=r`, not a list.
speculators 0.3.0 then indexes `[0]` into that reply and gets the first layer's tensor.
Without `unique_reply_rank` every release returns a list with rank 0 first, so dropping
the argument keeps the existing `[0]` correct.
"""

from patcher.fixes.codemods import RemoveKeyword
from patcher.fixes.patch import CheckHooks, Patch, VllmFact
from patcher.fixes.probes import returns_not_list


class DropUniqueReplyRank(RemoveKeyword):
    DESCRIPTION = 'collective_rpc("_get_captured_states", unique_reply_rank=0) -> without it'
    CALLEE = "collective_rpc"
    FIRST_ARG = "_get_captured_states"
    KEYWORD = "unique_reply_rank"
    EXPECTED = ("0",)  # without it rank 0 comes first; another rank's reply cannot be had by dropping it


PATCH = Patch(
    id="SP006",
    name="collective-rpc-reply-list",
    version=1,
    title="collective_rpc: take rank 0 from the reply list instead of unique_reply_rank",
    risk="captures are read from rank 0's single reply as if it were a list: the wrong tensor",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=DropUniqueReplyRank,
    facts=(
        VllmFact(
            summary="collective_rpc(unique_reply_rank=r) returns one reply, not a list",
            symbol="MultiprocExecutor.collective_rpc",
            first_release="0.12.0",
            probe=returns_not_list("vllm/v1/executor/multiproc_executor.py", "MultiprocExecutor.collective_rpc"),
        ),
    ),
    order=60,
    portable=True,
    checks=CheckHooks(symptoms=(r"truth value of a Tensor|ambiguous",)),
)
