"""Small libcst helpers shared by codemods: keyword arguments that keep the call's layout,
and what a node's code does (``same_code``, ``code_digest``), so a codemod can tell the
shape it was written for from a hand-edited one."""

from __future__ import annotations

import ast
import hashlib
import textwrap

import libcst as cst
import libcst.matchers as m


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    """The ``name=...`` argument of ``call``, or None."""
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def append_keyword(call: cst.Call, name: str, value: str) -> cst.Call:
    """Return ``call`` with ``name=value`` appended, in the layout of its existing arguments.

    ``value`` is Python source for an expression. In a one-argument-per-line call the new
    argument gets its own line and the trailing comma style is kept.
    """
    new = cst.Arg(
        keyword=cst.Name(name),
        value=cst.parse_expression(value),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if len(args) >= 2 and args[-2].comma is not cst.MaybeSentinel.DEFAULT:
        between = args[-2].comma
    else:
        between = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    args[-1] = last.with_changes(comma=between)
    args.append(new.with_changes(comma=last.comma))
    return call.with_changes(args=args)


def remove_keyword(call: cst.Call, name: str) -> cst.Call:
    """Return ``call`` without its ``name=`` argument, keeping the trailing comma style."""
    args = list(call.args)
    index = next(i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == name)
    removed = args.pop(index)
    if index == len(args) and args:  # it was last: the new last argument takes its comma
        args[-1] = args[-1].with_changes(comma=removed.comma)
    return call.with_changes(args=args)


def calls_to(tree: cst.CSTNode, name: str) -> list[cst.Call]:
    """Every call whose callee is ``name`` or ``<anything>.name``."""
    callee = m.Name(name) | m.Attribute(attr=m.Name(name))
    return [c for c in m.findall(tree, m.Call(func=callee)) if isinstance(c, cst.Call)]


def statements(code: str, leading_lines=None) -> cst.FlattenSentinel:
    """Parse ``code`` (dedented statements) into a replacement for one statement.

    Comments above the first statement are kept (libcst would move them to a module
    header); ``leading_lines`` (the replaced statement's blank lines) go first.
    """
    body = list(cst.parse_module("pass\n" + code).body[1:])
    if leading_lines is not None:
        body[0] = body[0].with_changes(leading_lines=[*leading_lines, *body[0].leading_lines])
    return cst.FlattenSentinel(body)


def replace_statements(tree: cst.Module, replacements: dict[m.BaseMatcherNode, str]) -> cst.Module:
    """Replace every statement matching a key with that key's template (see ``statements``),
    keeping the replaced statement's blank lines above it."""
    return tree.visit(_ReplaceStatements(replacements))


class _ReplaceStatements(cst.CSTTransformer):
    def __init__(self, replacements: dict[m.BaseMatcherNode, str]) -> None:
        super().__init__()
        self.replacements = replacements

    def on_leave(self, original, updated):
        if isinstance(updated, cst.BaseStatement):
            for matcher, template in self.replacements.items():
                if m.matches(updated, matcher):
                    return statements(template, updated.leading_lines)
        return updated


def _shape(node: object) -> object:
    """Python's ``ast`` of a node as nested tuples, without what does not change behaviour
    across Python releases (empty fields, contexts, type comments, string kinds)."""
    if isinstance(node, ast.AST):
        return (
            type(node).__name__,
            tuple(
                (name, _shape(value))
                for name, value in ast.iter_fields(node)
                if value not in (None, []) and name not in ("ctx", "type_comment", "kind")
            ),
        )
    if isinstance(node, list):
        return tuple(_shape(v) for v in node)
    return node


def _parsed(code: str) -> ast.AST:
    code = textwrap.dedent(code).strip()
    try:
        return ast.parse(code, mode="eval")
    except SyntaxError:
        return ast.parse(code)


def code_of(node: cst.CSTNode) -> str:
    """The source of ``node`` alone (its leading blank lines and comments included)."""
    return cst.Module(body=[]).code_for_node(node)


def same_code(node: cst.CSTNode, expected: str) -> bool:
    """True when ``node`` does what the source ``expected`` does: the same Python ``ast``,
    whatever the layout and comments."""
    try:
        return _shape(_parsed(code_of(node))) == _shape(_parsed(expected))
    except SyntaxError:
        return False


def code_digest(node: cst.CSTNode) -> str:
    """sha256 (hex, first 16) of what ``node``'s code does (its ``ast``; layout and comments do
    not count): a codemod that deletes or replaces a whole function compares it with the
    digest of the function it was written for, so a hand edit in it is refused, not lost."""
    return hashlib.sha256(repr(_shape(_parsed(code_of(node)))).encode()).hexdigest()[:16]
