"""SP013: Request(eos_token_id=) is passed only where Request.__init__ takes it (portable)."""

from __future__ import annotations

import pytest

from patcher.engine import run_codemod
from speculators_patch_codemods.sp013_request_eos_token_id import PATCH

HEAD = "from vllm.v1.request import Request\n"
FLAG = (
    "import inspect\n\n"
    "# vLLM <= 0.16 requires Request(eos_token_id=); 0.17 removed it. Read once, at import.\n"
    '_REQUEST_TAKES_EOS_TOKEN_ID = "eos_token_id" in inspect.signature(Request.__init__).parameters\n'
)
SPLAT = '**({"eos_token_id": %s} if _REQUEST_TAKES_EOS_TOKEN_ID else {})'


def rewrite(src: str) -> tuple[str, str]:
    verdict, new, _ = run_codemod(PATCH, src.encode(), "3.11")
    return verdict, new.decode()


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        pytest.param(
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
            HEAD + "r = Request(rid, ids, sp, None, eos_token_id=eos)\n",
            HEAD + FLAG + f"r = Request(rid, ids, sp, None, {SPLAT % 'eos'})\n",
            id="last keyword on one line",
        ),
        pytest.param(
            "import inspect\n" + HEAD + "r = request.Request(rid, eos_token_id=eos, arrival_time=0.0,)\n",
            "import inspect\n"
            + HEAD
            + FLAG.removeprefix("import inspect\n")
            + f"r = request.Request(rid, {SPLAT % 'eos'}, arrival_time=0.0,)\n",
            id="attribute callee, trailing comma kept, inspect already imported",
        ),
        pytest.param(
            HEAD.replace("\n", "\r\n") + "r = Request(rid, eos_token_id=eos)\r\n",
            (HEAD + FLAG).replace("\n", "\r\n") + f"r = Request(rid, {SPLAT % 'eos'})\r\n",
            id="CRLF file stays CRLF",
        ),
    ],
)
def test_request_eos_token_id(src: str, expected: str) -> None:
    assert rewrite(src) == ("changed", expected)
    assert rewrite(expected)[0] == "satisfied"  # applying twice equals applying once


@pytest.mark.parametrize(
    "src",
    [
        pytest.param(HEAD + "r = Request(rid, ids, sp, None, arrival_time=0.0)\n", id="already without eos_token_id"),
        pytest.param(HEAD + FLAG + f"r = Request(rid, {SPLAT % 'eos'})\n", id="already portable"),
    ],
)
def test_request_eos_token_id_noop(src: str) -> None:
    assert rewrite(src) == ("satisfied", src)


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        pytest.param("x = make_request(eos_token_id=1)\n", "a call Request(...)", id="no Request call"),
        pytest.param(
            HEAD + "_REQUEST_TAKES_EOS_TOKEN_ID = True\nr = Request(rid, eos_token_id=eos)\n",
            "no module-level _REQUEST_TAKES_EOS_TOKEN_ID",
            id="our name already taken",
        ),
    ],
)
def test_request_eos_token_id_refuses_unknown_code(src: str, expected: str) -> None:
    verdict, _, detail = run_codemod(PATCH, src.encode(), "3.11")
    assert verdict == "refused" and expected in detail


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
