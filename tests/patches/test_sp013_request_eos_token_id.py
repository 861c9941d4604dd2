"""SP013: Request(eos_token_id=) is dropped where vLLM (>= 0.17) no longer takes it."""

from __future__ import annotations

import pytest

from patcher.engine import run_codemod
from patcher.vllm_source import VllmSource
from speculators_patch_codemods.sp013_request_eos_token_id import PATCH


def rewrite(src: str) -> tuple[str, str]:
    verdict, new, _ = run_codemod(PATCH, src.encode(), "3.11")
    return verdict, new.decode()


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        pytest.param(
            "req = Request(\n"
            "    request_id=rid,\n"
            "    pooling_params=None,\n"
            "    eos_token_id=self.tokenizer.eos_token_id,\n"
            "    arrival_time=INITIAL_ARRIVAL_TIME,\n"
            ")\n",
            "req = Request(\n"
            "    request_id=rid,\n"
            "    pooling_params=None,\n"
            "    arrival_time=INITIAL_ARRIVAL_TIME,\n"
            ")\n",
            id="speculators 0.3.0 layout, one argument per line",
        ),
        pytest.param(
            "r = Request(rid, ids, sp, None, eos_token_id=eos)\n",
            "r = Request(rid, ids, sp, None)\n",
            id="last keyword on one line",
        ),
        pytest.param(
            "r = request.Request(rid, eos_token_id=eos, arrival_time=0.0,)\n",
            "r = request.Request(rid, arrival_time=0.0,)\n",
            id="attribute callee, trailing comma kept",
        ),
    ],
)
def test_request_eos_token_id(src: str, expected: str) -> None:
    assert rewrite(src) == ("changed", expected)
    assert rewrite(expected)[0] == "satisfied"  # applying twice equals applying once


@pytest.mark.parametrize(
    "src",
    [
        pytest.param("r = Request(rid, ids, sp, None, arrival_time=0.0)\n", id="already without eos_token_id"),
    ],
)
def test_request_eos_token_id_noop(src: str) -> None:
    assert rewrite(src) == ("satisfied", src)


def test_request_eos_token_id_refuses_unknown_code() -> None:
    verdict, _, detail = run_codemod(PATCH, b"x = make_request(eos_token_id=1)\n", "3.11")
    assert verdict == "refused" and "a call Request(...)" in detail


REQUEST_016 = b'''
class Request:
    def __init__(self, request_id: str, prompt_token_ids, sampling_params, pooling_params,
                 eos_token_id: int | None, client_index: int = 0) -> None:
        pass
'''
REQUEST_017 = REQUEST_016.replace(b"eos_token_id: int | None, ", b"")


@pytest.mark.parametrize(("source", "needed"), [
    pytest.param(REQUEST_016, False, id="0.16: still takes eos_token_id"),
    pytest.param(REQUEST_017, True, id="0.17: removed"),
])
def test_request_eos_token_id_probe(source: bytes, needed: bool) -> None:
    (fact,) = PATCH.facts
    evidence = fact.probe(VllmSource({"vllm/v1/request.py": source}))
    assert evidence.holds is needed
    assert evidence.where == "vllm/v1/request.py:3"
