"""``--json`` is valid UTF-8 with every path intact under ``LC_ALL=C``, also where Python's UTF-8
mode is off (``PYTHONUTF8=0``: file names then reach Python as lone surrogates)."""

from __future__ import annotations

import json

from sandbox import make_sandbox
from support import run_cli

C_LOCALE = {"LC_ALL": "C", "LANG": "", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}


def strict(stdout: bytes) -> dict:
    return json.loads(stdout.decode("utf-8"), object_pairs_hook=dict)


def test_a_non_ascii_path_under_the_c_locale(tmp_path):
    env = make_sandbox(tmp_path / "café" / "env")
    proc = run_cli("status", "--target", str(env), "--json", env=C_LOCALE, text=False)
    data = strict(proc.stdout)
    assert data["python"] == f"{env}/bin/python" and "café" in data["site_packages"]
    assert "\\udc" not in proc.stdout.decode()  # no escaped lone surrogate either
    proc = run_cli("status", "--target", str(tmp_path / "café" / "nope"), "--json", env=C_LOCALE, text=False)
    assert strict(proc.stdout) == {"error": f"target does not exist: {tmp_path}/café/nope", "exit_code": 2}
