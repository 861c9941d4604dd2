"""A static, import-free view of the installed vLLM's Python source, and of the other
libraries patch facts read (transformers, torch).

Reading their source with ``ast`` needs no GPU, no torch and no import of vLLM (which
takes seconds and may fail on the machine running this tool). The files come from the
target (local or over SSH) in one batch; probes may read only the files they declare.
A path names its library by its first component (``vllm/config/cache.py``,
``transformers/configuration_utils.py``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Mapping

from patcher.errors import UserError


@dataclass(frozen=True)
class Evidence:
    """What a probe found. ``file`` is relative to site-packages; ``line`` is 1-based.

    ``missing``: the symbol the fact is about (the function whose signature it reads, the
    class whose field it reads) is not in this vLLM at all. Then the fact neither holds nor
    fails: speculators' code that the patch rewrites uses that symbol, so it breaks here
    whether the patch is applied or not, and the engine reports the patch ``fact-missing``
    (never ``not-needed``). A probe that detects a feature (``method_defined``) reports an
    absent method as ``holds=False``, not as missing.
    """

    holds: bool
    file: str
    line: int | None
    found: str
    missing: bool = False

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


class LibrarySource:
    """Parsed library modules keyed by path relative to their import root (``vllm/...py``,
    ``transformers/...py``, ``torch/...py``).

    Args:
        files: path -> source bytes; a path missing from the install maps to ``None``.
        version: the version string(s) of the installed vLLM, for display only.
        libraries: the other libraries read -> their installed version(s), ``None`` when
            the library is not installed (its files then map to ``None``).
    """

    def __init__(
        self,
        files: Mapping[str, bytes | None],
        version: str = "unknown",
        libraries: Mapping[str, str | None] | None = None,
    ) -> None:
        self._files = dict(files)
        self._trees: dict[str, ast.Module | None] = {}
        self.version = version
        self.libraries = dict(libraries or {})

    def installed(self, library: str) -> bool:
        """Whether ``library`` (``vllm``, ``transformers``, ``torch``) is installed on the target."""
        return library == "vllm" or self.libraries.get(library, "") is not None

    def version_of(self, library: str) -> str:
        """The installed version of ``library`` for display (``vllm``: ``version``)."""
        if library == "vllm":
            return self.version
        return self.libraries.get(library) or "not installed"

    @property
    def files(self) -> dict[str, bytes | None]:
        """The fetched files (path -> bytes, ``None`` where the install lacks the file)."""
        return dict(self._files)

    def has(self, path: str) -> bool:
        return self._files.get(path) is not None

    def tree(self, path: str) -> ast.Module | None:
        """The module's AST, or ``None`` when the file does not exist in this vLLM.

        Raises ``KeyError`` when ``path`` was not fetched (a probe reading an undeclared
        module is a bug in that probe).
        """
        if path not in self._files:
            raise KeyError(f"{path} was not fetched; declare it in the fact's modules")
        if path not in self._trees:
            data = self._files[path]
            try:
                self._trees[path] = None if data is None else ast.parse(data, filename=path)
            except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte
                line = getattr(e, "lineno", None)
                raise UserError(
                    f"vLLM's {path}{f':{line}' if line else ''} cannot be read as Python "
                    f"({getattr(e, 'msg', None) or e}); reinstall vLLM"
                ) from None
        return self._trees[path]

    def find_class(self, path: str, name: str) -> ast.ClassDef | None:
        """The module-level class ``name`` of ``path``, following one module-level alias
        (``PretrainedConfig = PreTrainedConfig`` in transformers 5); None when absent."""
        tree = self.tree(path)
        if tree is None:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Name)
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            ):
                return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == node.value.id), None)
        return None

    def find_function(self, path: str, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """Find ``func`` or ``Class.method`` (the last definition wins, as at runtime)."""
        tree = self.tree(path)
        if tree is None:
            return None
        scope: list[ast.stmt] = tree.body
        *outer, name = qualname.split(".")
        for cls_name in outer:
            cls = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
            if cls is None:
                return None
            scope = cls.body
        found = None
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                found = node
        return found

    def class_fields(self, path: str, name: str) -> dict[str, ast.AnnAssign]:
        """Annotated class-level fields of a (pydantic) dataclass, by name."""
        cls = self.find_class(path, name)
        if cls is None:
            return {}
        return {n.target.id: n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, focus: str | None = None, most: int = 4) -> str:
    """``name(args) -> returns`` as written in the source, e.g.
    ``sample_tokens(self, grammar_output: 'GrammarOutput | None')``.

    A signature with more than ``most`` parameters is shortened to the ``focus`` parameter
    (``__init__(self, ..., block_size: int, ...)``), or to a count when it lacks it.
    """
    every = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    if len(every) <= most or focus is None:
        text = f"{fn.name}({ast.unparse(fn.args)})"
    else:
        hit = next((a for a in every if a.arg == focus), None)
        shown = f"{ast.unparse(hit)}, ..." if hit is not None else f"{len(every) - 1} more, no {focus}"
        text = f"{fn.name}({every[0].arg}, ..., {shown})"
    if fn.returns is not None:
        text += f" -> {ast.unparse(fn.returns)}"
    return text


def parameter_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = fn.args
    every = args.posonlyargs + args.args + args.kwonlyargs
    return [a.arg for a in every]


def required_parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Parameters without a default (``self`` excluded)."""
    args = fn.args
    positional = args.posonlyargs + args.args
    n_required = len(positional) - len(args.defaults)
    names = [a.arg for a in positional[:n_required]]
    names += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    return [n for n in names if n not in ("self", "cls")]
