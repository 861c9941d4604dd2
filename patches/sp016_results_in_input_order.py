"""SP016: speculators 0.4.x returns results in input order, for any number of prompts.

speculators 0.4.0/0.4.0.1 (data_generation/vllm_hidden_states_generator.py:335) names
requests ``req_<call>_<index>`` and builds its result list with
``for req_id in sorted(request_id_to_idx.keys())``: a string sort, so from 11 prompts on
``req_0_10`` comes before ``req_0_2`` and ``results[k]`` is no longer prompt ``k``'s
(measured on vLLM 0.16.0 CPU: 11 of 13 prompts, 22 of 24; each result carries its own
prompt's ``input_ids``, so a caller pairing results with its inputs by position trains on
the wrong hidden states without an error).

The emitted code sorts the request ids by the input index they map to
(``request_id_to_idx``: request id -> position in ``token_ids``). No vLLM fact: the fault
is in speculators' own logic, on every vLLM release.
"""

import libcst.matchers as m

from patcher.fixes.codemods import Replace
from patcher.fixes.patch import Patch

IDS = m.Name("request_id_to_idx")
# sorted(request_id_to_idx.keys())
STRING_SORT = m.Call(func=m.Name("sorted"), args=[m.Arg(m.Call(func=m.Attribute(IDS, m.Name("keys")), args=[]))])
# sorted(request_id_to_idx, key=...)
KEYED_SORT = m.Call(func=m.Name("sorted"), args=[m.Arg(IDS), m.Arg(keyword=m.Name("key"))])


class ResultsInInputOrder(Replace):
    DESCRIPTION = "sorted(request_id_to_idx.keys()) -> sorted(request_id_to_idx, key=request_id_to_idx.get)"
    MATCH = STRING_SORT
    REPLACEMENT = "sorted(request_id_to_idx, key=request_id_to_idx.get)"
    SATISFIED = KEYED_SORT
    SATISFIED_REASON = "request ids are sorted by their input index"
    EXPECTED = "'sorted(request_id_to_idx.keys())' (the results loop of generate())"
    TOUCHES = m.Call(func=m.Name("sorted"), args=[m.Arg(m.Call(func=m.Attribute(IDS, m.Name("keys")))), m.ZeroOrMore()])


PATCH = Patch(
    id="SP016",
    name="results-in-input-order",
    version=1,
    title="Results (0.4.x): in input order, not request ids sorted as strings (req_10 < req_2)",
    risk="from 11 prompts on, results are returned paired with the wrong prompts",
    file="speculators/data_generation/vllm_hidden_states_generator.py",
    codemod=ResultsInInputOrder,
    speculators=">=0.4.0,<0.4.1",
    order=130,
    portable=True,
)
