"""The bootstrap: what every transport starts first -- locally under speculators-patch's
own Python, over ``ssh HOST`` and ``--exec`` under the far side's python3, and in the
Ansible collection's module -- and the one place where ``--target`` becomes an interpreter
(docs/ARCHITECTURE.md, "Which interpreter a target is").

It reads one length-prefixed JSON header from stdin -- ``target`` (the ``--target`` path,
or null), ``agent`` (the agent program: ``patcher.connect.program.AGENT_PROGRAM``),
``where`` (the host or command, for messages; null locally) and ``marker`` -- resolves the
target on this side (so ``~`` is this machine's home and ``$VIRTUAL_ENV`` this side's), and
replaces itself with the chosen interpreter running the agent, which prints the marker as
its first line: whatever a login shell's rc files printed before it, the client skips. A
refusal here is the marker and one JSON error line. ``PYTHONPATH`` is dropped for the
agent: the caller's search path must not decide which tree is patched.

Sent as text (``python -c``), never imported. Any Python 3; it stays Python 2 parseable,
so that a Python 2 says "too old" instead of failing to parse.
"""
import errno, json, os, re, sys

ON = ""

def fail(msg):
    sys.stdout.write("\n" + header["marker"] + "\n" + json.dumps({"error": msg}) + "\n")
    sys.stdout.flush()
    sys.exit(3)

def read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            sys.exit(0)
        buf += chunk
    return buf

def is_python(path):
    """Nothing is sent to a program before its name says it is Python (not bash, not a script)."""
    names = (os.path.basename(path), os.path.basename(os.path.realpath(path)))
    return any(re.match(r"(python|pypy)[0-9.]*$", n) for n in names)

def environment_python(prefix):
    for name in ("python", "python3"):
        if os.path.exists(os.path.join(prefix, "bin", name)):
            return os.path.join(prefix, "bin", name)
    return None

def resolve(target):
    """(interpreter, its flags, a bare site-packages directory or None), or ``fail``."""
    if target is None:  # the active environment of this side, else the Python running this
        for variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
            prefix = os.environ.get(variable)
            if prefix:
                python = environment_python(prefix)
                if python is None:
                    fail("$%s%s is %s, which has no bin/python; pass --target" % (variable, ON, prefix))
                return python, [], None
        return sys.executable, [], None
    if not target.strip() or "\0" in target:
        fail("--target is empty" if not target.strip() else "--target contains a NUL byte")
    path = os.path.abspath(os.path.expanduser(target))
    try:
        os.stat(path)
    except OSError as e:  # missing, or under a directory this user cannot traverse
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            fail("target does not exist%s: %s" % (ON, target))
        fail("cannot read target%s %s: %s" % (ON, target, e.strerror))
    if os.path.isfile(path):
        if not os.access(path, os.X_OK) or not is_python(path):
            fail("target%s is a file but not a Python interpreter (python3, python3.X): %s" % (ON, target))
        return path, [], None
    try:
        entries = os.listdir(path)
    except OSError as e:
        fail("cannot read target%s %s: %s" % (ON, target, e.strerror))
    python = environment_python(path)
    if python is not None:
        return python, [], None
    if os.path.basename(path) in ("site-packages", "dist-packages") or [e for e in entries if e.endswith(".dist-info")]:
        return sys.executable, ["-I", "-S"], os.path.realpath(path)
    fail("target%s is not a Python environment (no bin/python), site-packages directory or interpreter: %s"
         % (ON, target))

size = b""
while not size.endswith(b"\n"):
    size += read_exact(1)
header = json.loads(read_exact(int(size)).decode("utf-8"))
if header["where"]:
    ON = " on " + header["where"]
if sys.version_info < (3, 8):
    fail("%s: the agent needs Python 3.8+, %s is %d.%d" % ((header["where"] or "local", sys.executable)
                                                           + tuple(sys.version_info[:2])))
python, flags, site_dir = resolve(header["target"])
argv = [python] + flags + ["-c", header["agent"], header["marker"]] + (["--site-packages=" + site_dir] if site_dir else [])
env = dict((k, v) for k, v in os.environ.items() if k != "PYTHONPATH")
try:
    os.execve(python, argv, env)
except OSError as e:
    fail("cannot run %s%s: %s" % (python, ON, e.strerror))
