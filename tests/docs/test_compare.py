"""The docs tier's comparer: elisions, tables read back into rows, normalised times and paths."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from snapshots import matches  # noqa: E402

pytestmark = pytest.mark.fast

WIDE = """\
┏━━━━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ patch    ┃ state       ┃ title                                       ┃
┡━━━━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│ SP001 v1 │ applied now │ SchedulerConfig: pass is_encoder_decoder    │
│ SP002 v1 │ applied now │ get_kv_cache_config_from_groups: drop it    │
│ SP003 v1 │ not-needed  │ Scheduler: pass the required block_size     │
└──────────┴─────────────┴─────────────────────────────────────────────┘
patched 1 file(s) under /home/me/x/lib/python3.12/site-packages in 1.25s"""

NARROW = """\
┏━━━━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━┓
┃ patch    ┃ state       ┃ title                ┃
┡━━━━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━┩
│ SP001 v1 │ applied now │ SchedulerConfig:     │
│          │             │ pass                 │
│          │             │ is_encoder_decoder   │
│ SP002 v1 │ applied now │ get_kv_cache_config_ │
│          │             │ from_groups: drop it │
│ SP003 v1 │ not-needed  │ Scheduler: pass the  │
│          │             │ required block_size  │
└──────────┴─────────────┴──────────────────────┘
patched 1 file(s) under
/home/me/x/lib/python3.11/site-packages in 0.3 s"""


def test_a_table_compares_the_same_at_any_width_and_wrapped_text_by_words():
    assert matches(WIDE.splitlines(), NARROW) is None
    assert matches(NARROW.splitlines(), WIDE) is None


def test_a_changed_cell_or_word_is_a_difference():
    assert matches(WIDE.replace("not-needed", "applied   ").splitlines(), NARROW) is not None
    assert matches(WIDE.replace("patched 1", "patched 2").splitlines(), NARROW) is not None


def test_elision_stands_for_any_lines_and_only_there():
    lines = WIDE.splitlines()
    trimmed = lines[:4] + ["..."] + lines[6:]
    assert matches(trimmed, NARROW) is None
    assert matches(["..."] + lines[-1:], NARROW) is None
    assert matches(lines[:4] + ["..."], NARROW) is None
    assert matches(lines[:4] + lines[6:], NARROW) is not None  # rows left out without `...`
    assert matches(lines[:4] + ["...", lines[3]] + ["..."], NARROW) is not None  # order kept


def test_empty_output_is_shown_as_nothing():
    assert matches([], "") is None
    assert matches([], "error: something\n") is not None
