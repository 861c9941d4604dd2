"""The batches selftest feeds speculators' generator: each one a ``generate()`` call on one
generator, each aimed at a way extraction has gone wrong before.

Token ids are random (seeded) in ``[4, vocab)``: ids 0-3 are the tokenizer's specials.
Lengths assume ``MAX_MODEL_LEN`` 512 and speculators 0.3.0's scheduler limits
(``MAX_NUM_SEQS`` 32, a step budget of ``max(8192, max_model_len)`` tokens).
"""

from __future__ import annotations

import random

MAX_MODEL_LEN = 512
SHARED_PREFIX = 96  # tokens; six 16-token KV blocks, so a prefix cache would hit

# name: (seed, lengths, what it exercises)
CASES = {
    "order": (
        11,
        [37, 1, 120, 5, 64, 250, 9, 17, 300, 2, 45, 77, 13],
        "13 prompts of 1-300 tokens: results in input order past 10 requests (req_10 < req_2 as strings)",
    ),
    "shared-prefix": (
        21,
        [SHARED_PREFIX + n for n in (0, 8, 40, 130, 3, 200)],
        "6 prompts sharing a 96-token prefix: a prefix cache must not drop their rows",
    ),
    "chunked": (
        31,
        list(range(300, 511, 9))[:24],
        "24 prompts of 300-510 tokens (9,660 > 8,192 per step): prompts split across scheduler steps",
    ),
    "over-max-seqs": (
        41,
        [3 + (i * 7) % 40 for i in range(41)],
        "41 prompts, more than max_num_seqs (32): every one captured",
    ),
    "order-again": (
        11,
        [37, 1, 120, 5, 64, 250, 9, 17, 300, 2, 45, 77, 13],
        "the first batch again on the same generator: identical results",
    ),
}


def prompts(case: str, vocab_size: int) -> list[list[int]]:
    """The token ids of ``case``: a list of prompts, each a list of ints."""
    seed, lengths, _ = CASES[case]
    rng = random.Random(seed)
    if case == "shared-prefix":
        prefix = [rng.randrange(4, vocab_size) for _ in range(SHARED_PREFIX)]
        return [prefix + [rng.randrange(4, vocab_size) for _ in range(n - SHARED_PREFIX)] for n in lengths]
    return [[rng.randrange(4, vocab_size) for _ in range(n)] for n in lengths]


def layer_ids(num_layers: int) -> list[int]:
    """First, middle and last decoder layer."""
    return sorted({0, num_layers // 2, num_layers - 1})
