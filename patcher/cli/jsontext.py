"""``--json`` output that is valid UTF-8 whatever the locale.

Under ``LC_ALL=C`` without Python's UTF-8 mode (``PYTHONUTF8=0``, or a Python that does not turn it
on), paths are decoded with ``surrogateescape``: a non-ASCII file name becomes lone surrogates
(``/tmp/\\udcc3\\udca9``), which ``json.dumps`` writes as escapes no strict parser accepts as text.
"""

from __future__ import annotations

import json
from typing import Any


def _text(value: str) -> str:
    """``value`` with each escaped byte restored: the bytes the system gave, read as UTF-8
    (``é`` back from ``\\udcc3\\udca9``); bytes that are not UTF-8 are shown as ``\\xNN``."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def restored(data: Any) -> Any:
    """``data`` (dicts, lists, tuples, strings and scalars) with every string ``_text``-ed, keys included."""
    if isinstance(data, str):
        return _text(data)
    if isinstance(data, dict):
        return {restored(k): restored(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [restored(v) for v in data]
    return data


def dumps(data: Any, indent: int | None = None) -> str:
    """``json.dumps`` of ``data`` whose strings are all valid Unicode (``restored``)."""
    return json.dumps(restored(data), indent=indent)
