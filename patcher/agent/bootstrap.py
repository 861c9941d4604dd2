"""The bootstrap, and the one rule that turns ``--target`` into an interpreter (``resolve``;
docs/ARCHITECTURE.md, "Which interpreter a target is").

Run as a program (``python -c``) it is what ``ssh HOST`` and ``--exec`` start first under
the far side's python3, and what the Ansible collection's module runs: it reads one
length-prefixed JSON header from stdin -- ``target`` (the ``--target`` path, or null),
``agent`` (the agent program: ``patcher.connect.program.AGENT_PROGRAM``), ``where`` (the
host or command, for messages) and ``marker`` -- resolves the target on that side (so ``~``
and ``$VIRTUAL_ENV`` are that side's) and replaces itself with the chosen interpreter
running the agent, which prints the marker as its first line: whatever a login shell's rc
files printed before it, the client skips. A refusal is the marker and one JSON error line.
Locally the controller imports this module and calls ``resolve`` and ``agent_environment``
itself, which saves starting one more interpreter.

Standard library only; any Python 3, and it stays Python 2 parseable, so that a Python 2
says "too old" instead of failing to parse.
"""

import errno
import json
import os
import re
import sys


class Refused(Exception):
    """A target the rule refuses; the message is the one line the user sees."""


def is_python(path):
    """Nothing is sent to a program before its name says it is Python (not bash, not a script)."""
    names = (os.path.basename(path), os.path.basename(os.path.realpath(path)))
    return any(re.match(r"(python|pypy)[0-9.]*$", n) for n in names)


def environment_python(prefix, on=""):
    """``prefix/bin/python`` (or ``python3``), or None; a link that cannot be followed is
    refused here rather than taken for no interpreter at all."""
    for name in ("python", "python3"):
        path = os.path.join(prefix, "bin", name)
        if os.path.lexists(path):
            if not os.path.exists(path):
                raise Refused(
                    "%s%s is a link that cannot be followed (to %s; missing, or not readable by this user)"
                    % (path, on, os.readlink(path))
                )
            return path
    return None


def resolve(target, where=None, environ=None, executable=None):
    """``target`` (a path, or None) -> (interpreter, its flags, a bare site-packages
    directory or None); raises ``Refused``. ``where`` names the host or command in
    messages (None: this machine); ``environ`` and ``executable`` default to this
    process's ``os.environ`` and ``sys.executable`` (the Python that falls back)."""
    environ = os.environ if environ is None else environ
    executable = sys.executable if executable is None else executable
    on = " on " + where if where else ""
    if not executable:  # e.g. started with no PATH: Python cannot say where it is

        def fallback():
            raise Refused(
                "the Python%s cannot tell its own path (sys.executable is empty: started without PATH?); "
                "pass --target" % on
            )
    else:

        def fallback():
            return executable

    if target is None:  # the active environment of this side, else the Python running this
        for variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
            prefix = environ.get(variable)
            if prefix:
                python = environment_python(prefix, on)
                if python is None:
                    raise Refused("$%s%s is %s, which has no bin/python; pass --target" % (variable, on, prefix))
                return python, [], None
        return fallback(), [], None
    if not target.strip() or "\0" in target:
        raise Refused("--target is empty" if not target.strip() else "--target contains a NUL byte")
    path = os.path.abspath(os.path.expanduser(target))
    try:
        os.stat(path)
    except OSError as e:  # missing, or under a directory this user cannot traverse
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            if os.path.islink(path):  # the link is there; what it names is not
                raise Refused(
                    "target%s is a symbolic link to %s, which does not exist: %s" % (on, os.readlink(path), target)
                )
            shown = target if path in (target, target.rstrip("/")) else "%s (%s)" % (target, path)
            # scp's [user@]host:/path, or an ssh:// URL: the remote env is --host's
            remote = re.match(r"^ssh://([^/\s]+)(/.*)$", target) or re.match(r"^([^/:\s]+):(/.*)$", target)
            hint = "; for a remote env pass --host %s --target %s" % remote.groups() if remote else ""
            raise Refused("target does not exist%s: %s%s" % (on, shown, hint))
        raise Refused("cannot read target%s %s: %s" % (on, target, e.strerror))
    if os.path.isfile(path):
        if not os.access(path, os.X_OK) or not is_python(path):
            raise Refused("target%s is a file but not a Python interpreter (python3, python3.X): %s" % (on, target))
        return path, [], None
    try:
        entries = os.listdir(path)
    except OSError as e:
        raise Refused("cannot read target%s %s: %s" % (on, target, e.strerror))
    python = environment_python(path, on)
    if python is not None:
        return python, [], None
    if os.path.basename(path) in ("site-packages", "dist-packages") or [e for e in entries if e.endswith(".dist-info")]:
        return fallback(), ["-I", "-S"], os.path.realpath(path)
    raise Refused(
        "target%s is not a Python environment (no bin/python), site-packages directory or interpreter: %s"
        % (on, target)
    )


def agent_environment(environ):
    """The agent's environment: ``environ`` without ``PYTHONPATH`` (the caller's search
    path must not decide which tree is patched while the state goes to the target)."""
    return dict((k, v) for k, v in environ.items() if k != "PYTHONPATH")


def agent_argv(python, flags, site_dir, agent, marker):
    """The agent's command line: ``python -c AGENT MARKER [--site-packages=DIR]``."""
    return [python] + flags + ["-c", agent, marker] + (["--site-packages=" + site_dir] if site_dir else [])


def _read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            sys.exit(0)
        buf += chunk
    return buf


def main():
    size = b""
    while not size.endswith(b"\n"):
        size += _read_exact(1)
    header = json.loads(_read_exact(int(size)).decode("utf-8"))

    def fail(msg):
        sys.stdout.write("\n" + header["marker"] + "\n" + json.dumps({"error": msg}) + "\n")
        sys.stdout.flush()
        sys.exit(3)

    if sys.version_info[:2] < (3, 8):  # the words of ``loader.too_old``, which checks the agent's interpreter
        fail(
            "the agent needs Python 3.8+: %s is Python %d.%d; nothing was read or changed"
            % ((sys.executable or "this interpreter",) + tuple(sys.version_info[:2]))
        )
    try:
        python, flags, site_dir = resolve(header["target"], header["where"])
    except Refused as e:
        fail(str(e))
    # Which interpreter the rule chose, for the client's messages should it fail to start the agent.
    sys.stdout.write("\n%s exec %s\n" % (header["marker"], python))
    sys.stdout.flush()
    try:
        os.execve(
            python,
            agent_argv(python, flags, site_dir, header["agent"], header["marker"]),
            agent_environment(os.environ),
        )
    except OSError as e:
        fail("cannot run %s%s: %s" % (python, " on " + header["where"] if header["where"] else "", e.strerror))


if __name__ == "__main__":
    main()
