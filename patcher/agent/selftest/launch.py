"""Start selftest under the target's interpreter (standard library only; Python 3.8+).

The controller sends this file's source to the agent's ``run_python`` op (locally or over
SSH), with the package's modules as data on stdin: ``{"modules": {name: source},
"request": {...}, "site_packages": path or None}``. It writes them into a fresh temporary
directory, imports them from there, runs ``run.main`` and prints the report as one line
after ``MARKER``. The temporary directory (modules and tiny models) is removed on every
way out: normal end, an exception, SIGINT, SIGTERM or SIGHUP (a dropped SSH session).
"""

import json
import os
import shutil
import signal
import sys
import tempfile

MARKER = "@@speculators-patch-selftest@@"
PACKAGE = "speculators_patch_selftest"


def _stop(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through ``finally``: engine shut down, files removed


def main():
    payload = json.loads(sys.stdin.read())
    if payload.get("site_packages"):
        import site

        site.addsitedir(payload["site_packages"])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    workdir = tempfile.mkdtemp(prefix="speculators-patch-selftest-")
    try:
        package = os.path.join(workdir, PACKAGE)
        os.mkdir(package)
        for name, source in payload["modules"].items():
            with open(os.path.join(package, name), "w", encoding="utf-8") as f:
                f.write(source)
        sys.path.insert(0, workdir)
        from speculators_patch_selftest import run  # noqa: E402  (written just above)

        report = run.main(payload["request"], __import__("pathlib").Path(workdir) / "models")
        report["workdir"] = workdir
        sys.stdout.write("\n" + MARKER + json.dumps(report) + "\n")
        sys.stdout.flush()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


main()
