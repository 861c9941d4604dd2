"""SP013: Request(eos_token_id=) is passed only where Request.__init__ takes it (portable)."""

from __future__ import annotations

import pytest
from codemods import codemod, noop_test, refusal_test, rewrite_test

from speculators_patch_codemods.sp013_request_eos_token_id import PATCH

pytestmark = pytest.mark.fast

HEAD = "from vllm.v1.request import Request\n"
FLAG = (
    "import inspect\n\n"
    "# vLLM <= 0.16 requires Request(eos_token_id=); 0.17 removed it. Read once, at import.\n"
    '_REQUEST_TAKES_EOS_TOKEN_ID = "eos_token_id" in inspect.signature(Request.__init__).parameters\n'
)
SPLAT = '**({"eos_token_id": %s} if _REQUEST_TAKES_EOS_TOKEN_ID else {})'


def rewrite(src: str) -> tuple[str, str]:
    return codemod(PATCH, src)[:2]


REWRITES = [
    pytest.param(
        "SP013",
        HEAD + "\nreq = Request(\n"
        "    request_id=rid,\n"
        "    pooling_params=None,\n"
        "    eos_token_id=self.tokenizer.eos_token_id,\n"
        "    arrival_time=INITIAL_ARRIVAL_TIME,\n"
        ")\n",
        HEAD + FLAG + "\nreq = Request(\n"
        "    request_id=rid,\n"
        "    pooling_params=None,\n"
        f"    {SPLAT % 'self.tokenizer.eos_token_id'},\n"
        "    arrival_time=INITIAL_ARRIVAL_TIME,\n"
        ")\n",
        id="speculators 0.3.0 layout, one argument per line",
    ),
    pytest.param(
        "SP013",
        HEAD + "r = Request(rid, ids, sp, None, eos_token_id=eos)\n",
        HEAD + FLAG + f"r = Request(rid, ids, sp, None, {SPLAT % 'eos'})\n",
        id="last keyword on one line",
    ),
    pytest.param(
        "SP013",
        "import inspect\n" + HEAD + "r = request.Request(rid, eos_token_id=eos, arrival_time=0.0,)\n",
        "import inspect\n"
        + HEAD
        + FLAG.removeprefix("import inspect\n")
        + f"r = request.Request(rid, {SPLAT % 'eos'}, arrival_time=0.0,)\n",
        id="attribute callee, trailing comma kept, inspect already imported",
    ),
    pytest.param(
        "SP013",
        HEAD.replace("\n", "\r\n") + "r = Request(rid, eos_token_id=eos)\r\n",
        (HEAD + FLAG).replace("\n", "\r\n") + f"r = Request(rid, {SPLAT % 'eos'})\r\n",
        id="CRLF file stays CRLF",
    ),
]

NOOPS = [
    pytest.param(
        "SP013", HEAD + "r = Request(rid, ids, sp, None, arrival_time=0.0)\n", id="already without eos_token_id"
    ),
    pytest.param("SP013", HEAD + FLAG + f"r = Request(rid, {SPLAT % 'eos'})\n", id="already portable"),
]

REFUSALS = [
    pytest.param("SP013", "x = make_request(eos_token_id=1)\n", "a call Request(...)", id="no Request call"),
    pytest.param(
        "SP013",
        HEAD + "_REQUEST_TAKES_EOS_TOKEN_ID = True\nr = Request(rid, eos_token_id=eos)\n",
        "no module-level _REQUEST_TAKES_EOS_TOKEN_ID",
        id="our name already taken",
    ),
]


test_request_eos_token_id = rewrite_test(REWRITES)


test_request_eos_token_id_noop = noop_test(NOOPS)


test_request_eos_token_id_refuses_unknown_code = refusal_test(REFUSALS)


def test_request_eos_token_id_is_portable_and_always_needed() -> None:
    """No vLLM fact gates it: a 0.16-patched install must survive an upgrade to 0.17."""
    assert PATCH.portable and PATCH.facts == () and PATCH.version == 2


class _Request016:
    def __init__(self, request_id, prompt_token_ids, sampling_params, pooling_params, eos_token_id, client_index=0):
        self.eos_token_id = eos_token_id


class _Request017:
    def __init__(self, request_id, prompt_token_ids, sampling_params, pooling_params, client_index=0):
        self.eos_token_id = None


@pytest.mark.parametrize(
    ("request_cls", "eos"),
    [
        pytest.param(_Request016, 7, id="0.16 shape: required eos_token_id is passed"),
        pytest.param(_Request017, None, id="0.17 shape: not passed, no TypeError"),
    ],
)
def test_emitted_code_runs_on_both_request_shapes(request_cls, eos) -> None:
    """The emitted code itself, executed against both constructor shapes (no vLLM needed)."""
    _, code = rewrite(HEAD + "r = Request('r', [1], None, None, eos_token_id=7)\n")
    namespace = {}
    exec(code.replace(HEAD, ""), {"Request": request_cls}, namespace)
    assert namespace["r"].eos_token_id == eos
