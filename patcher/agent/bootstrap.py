"""The bootstrap: what ``ssh HOST`` and ``--exec`` start first, under the far side's python3.

It reads one length-prefixed JSON header from stdin -- ``target`` (the ``--target`` path,
or null), ``agent`` (the agent program: ``patcher.connect.program.AGENT_PROGRAM``),
``where`` (a label for messages) and ``marker`` -- prints the marker (what a login shell's
rc files printed before it, the client skips), resolves the target on this side (so ``~``
is this machine's home) and replaces itself with the chosen interpreter running the agent
(a bare site-packages directory: isolated, ``--site-packages=DIR``). From then on the
connection carries the same JSON lines as a local agent.

Sent as text (base64 in the command line), never imported there. Any Python 3; it stays
Python 2 parseable, so that a Python 2 says "too old" instead of failing to parse.
"""
import json, os, sys

def fail(msg):
    sys.stdout.write(json.dumps({"error": msg}) + "\n")
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

size = b""
while not size.endswith(b"\n"):
    size += read_exact(1)
header = json.loads(read_exact(int(size)).decode("utf-8"))
target, agent, where = header["target"], header["agent"], header["where"]
# Whatever the login shell's rc files printed came before this line; the client skips it.
sys.stdout.write("\n" + header["marker"] + "\n")
sys.stdout.flush()
if sys.version_info < (3, 8):
    fail("%s: the agent needs Python 3.8+, %s is %d.%d" % ((where, sys.executable) + tuple(sys.version_info[:2])))
python, flags, site_dir = sys.executable, [], None
if target is not None:
    path = os.path.abspath(os.path.expanduser(target))
    if not os.path.exists(path):
        fail("target does not exist on %s: %s" % (where, target))
    if os.path.isfile(path):
        if not os.access(path, os.X_OK):
            fail("target on %s is a file but not an executable Python interpreter: %s" % (where, target))
        python = path
    else:
        for candidate in ("python", "python3"):
            if os.path.exists(os.path.join(path, "bin", candidate)):
                python = os.path.join(path, "bin", candidate)
                break
        else:
            try:
                entries = os.listdir(path)
            except OSError as e:
                fail("cannot read target on %s: %s: %s" % (where, target, e.strerror))
            if os.path.basename(path) in ("site-packages", "dist-packages") or [e for e in entries if e.endswith(".dist-info")]:
                flags, site_dir = ["-I", "-S"], path
            else:
                fail("target on %s is not a Python environment (no bin/python), site-packages directory "
                     "or interpreter: %s" % (where, target))
try:
    os.execv(python, [python] + flags + ["-c", agent] + (["--site-packages=" + site_dir] if site_dir else []))
except OSError as e:
    fail("cannot run %s on %s: %s" % (python, where, e.strerror))
