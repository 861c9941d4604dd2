"""``verify --runtime``: confirm the static call-site reading against the live vLLM.

The static check (``patcher.checks.callsite``) reads vLLM's source; this module asks the target's
own interpreter (local or over SSH, through the agent's ``run_python`` op) to import the
same names and read the same signatures with ``inspect``
(``patcher/agent/runtime_probe.py``), re-checks every recorded call against what it saw, and
reports each place where the two readings disagree. It takes seconds (vLLM imports torch)
and needs an importable vLLM, so static stays the default.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from patcher.checks.callsite import Checked, Finding, Param, Signature, check_call
from patcher.connect.transport import Transport
from patcher.errors import UserError

PROBE_SOURCE = (Path(__file__).resolve().parent.parent / "agent" / "runtime_probe.py").read_text(encoding="utf-8")
MARKER = "@@speculators-patch-runtime@@"
ENV = {"VLLM_LOGGING_LEVEL": "ERROR", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class RuntimeReport:
    """Findings from the live objects, and where they disagree with the static reading.

    ``import_seconds``: time the target spent importing vLLM and reading signatures;
    ``wall_seconds``: the whole exchange, child interpreter start included.
    """

    vllm_version: str | None
    findings: list[Finding]
    disagreements: list[str] = field(default_factory=list)
    import_seconds: float = 0.0
    wall_seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "vllm": self.vllm_version,
            "findings": [f.as_dict() for f in self.findings],
            "disagreements": self.disagreements,
            "import_seconds": round(self.import_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3),
        }


def probe_request(record: list[Checked], worker: tuple[str, str]) -> dict:
    """The probe's input for the calls ``check`` recorded."""
    imports = sorted({c.target[:2] for c in record if c.call is None})
    targets = sorted(
        {c.target for c in record if c.call is not None and c.target[0] != "<rpc>"},
        key=lambda t: (t[0], t[1], t[2] or ""),
    )
    rpc = sorted({c.target[1] for c in record if c.target[0] == "<rpc>" and c.target[2] is None})
    return {
        "imports": [list(i) for i in imports],
        "targets": [list(t) for t in targets],
        "worker": list(worker),
        "rpc": rpc,
    }


def run_probe(transport: Transport, request: dict, site_packages: str | None, timeout: float = 600) -> dict:
    """One ``run_python`` exchange. Raises ``UserError`` when the target cannot import vLLM."""
    answer = transport.request(
        "run_python",
        script=PROBE_SOURCE,
        input=json.dumps(request),
        site_packages=site_packages,
        timeout=timeout,
        env=ENV,
    )
    for line in reversed(answer["stdout"].splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    err = answer["stderr"].strip().splitlines()
    raise UserError(
        f"{transport.label}: the runtime reading failed (exit {answer['returncode']}): "
        f"{err[-1] if err else 'no output'}"
    )


def live_signature(static: Signature | None, label: str, live: dict) -> Signature | None:
    """The live description as a ``Signature`` (named as the static one, to compare)."""
    if "params" not in live:
        return None
    params, varargs, varkw = [], False, False
    for name, kind, required in live["params"]:
        if kind == "*":
            varargs = True
        elif kind == "**":
            varkw = True
        else:
            init_only = bool(static and (p := static.param(name)) and p.init_only)
            params.append(Param(name, required, kind, init_only))
    name = static.name if static else label.split("(")[0]
    text = static.text if static and "dataclass" in static.text else live["text"]
    return Signature(
        name,
        live.get("file") or "",
        live.get("line") or 0,
        text,
        tuple(params),
        varargs,
        varkw,
        live.get("extra", "error"),
    )


def compare(record: list[Checked], static: list[Finding], live: dict) -> tuple[list[Finding], list[str]]:
    """Re-check the recorded calls against the live reading; return (runtime findings,
    disagreements with the static findings and signatures)."""
    findings: list[Finding] = []
    notes: list[str] = []
    for c in record:
        if c.call is None:  # an import
            error = live["imports"].get(f"{c.target[0]}:{c.target[1]}")
            if error:
                findings.append(Finding("missing-import", c.file, c.line, c.label, error, subject=c.target[1]))
            continue
        if c.target[0] == "<rpc>":
            if c.target[2] is None and not live["rpc"].get(c.target[1], False):
                findings.append(
                    Finding(
                        "unknown-rpc",
                        c.file,
                        c.line,
                        c.label,
                        f"the live worker has no method {c.target[1]}",
                        subject=c.target[1],
                    )
                )
            continue
        module, name, method = c.target
        desc = live["targets"].get(f"{module}:{name}:{method or ''}", {})
        if desc.get("missing") and method:
            findings.append(
                Finding(
                    "missing-method", c.file, c.line, c.label, f"the live {name} has no method {method}", subject=method
                )
            )
            continue
        sig = live_signature(c.signature, c.label, desc)
        if sig is None:
            continue
        findings += check_call(c.file, c.line, c.label, c.call, sig)
        if c.signature is not None:
            notes += _signature_differences(c, c.signature, sig)

    def key(f: Finding) -> tuple:
        return (f.file, f.line, f.kind, f.subject)

    static_keys, live_keys = {key(f) for f in static}, {key(f) for f in findings}
    for f in static:
        if key(f) not in live_keys:
            notes.append(f"{f.where}: {f.call}: static reading reports {f.kind} {f.subject}, the live objects do not")
    for f in findings:
        if key(f) not in static_keys:
            notes.append(
                f"{f.where}: {f.call}: the live objects report {f.kind} {f.subject}, the static reading does not"
            )
    return sorted(set(findings), key=lambda f: (f.file, f.line, f.kind)), sorted(set(notes))


def _signature_differences(c: Checked, static: Signature, live: Signature) -> list[str]:
    """Parameters the two readings disagree on (name, or whether it is required)."""
    s = {p.name: p.required for p in static.params}
    r = {p.name: p.required for p in live.params}
    out = []
    for name in sorted(set(s) | set(r)):
        if name not in r and not live.varkw:
            out.append(
                f"{c.file}:{c.line}: {c.label}: {name} is in the source ({static.file}:{static.line}), not in the live signature"
            )
        elif name not in s and not static.varkw:
            out.append(
                f"{c.file}:{c.line}: {c.label}: the live signature has {name}, the source ({static.file}:{static.line}) does not"
            )
        elif name in s and name in r and s[name] != r[name]:
            state = {True: "required", False: "optional"}
            out.append(f"{c.file}:{c.line}: {c.label}: {name} is {state[s[name]]} in the source, {state[r[name]]} live")
    return out


def runtime_verify(
    transport: Transport,
    site_packages: str | None,
    checked: list[Checked],
    static: list[Finding],
    worker: tuple[str, str],
) -> RuntimeReport:
    """Re-check the calls the static check recorded against the live objects (one
    ``run_python`` exchange)."""
    start = time.perf_counter()
    live = run_probe(transport, probe_request(checked, worker), site_packages)
    wall = time.perf_counter() - start
    if live.get("vllm") is None:
        raise UserError(
            f"{transport.label}: the target's interpreter cannot import vLLM "
            f"({live.get('vllm_error', 'unknown error')}); verify --runtime needs an importable "
            f"vLLM, the static verify does not"
        )
    findings, notes = compare(checked, static, live)
    return RuntimeReport(live.get("vllm"), findings, notes, live.get("seconds", 0.0), wall)
