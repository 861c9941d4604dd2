"""Declarative codemod bases for the most common fixes: a keyword argument added or removed,
a statement or an expression replaced, a method added to a class.

A patch that only needs one of these sets a few class attributes; see ``patches/sp001_*``.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from patcher.fixes.cst_helpers import (
    append_keyword,
    calls_to,
    keyword,
    remove_keyword,
    replace_statements,
    same_code,
    statements,
)
from patcher.fixes.patch import PatchCodemod


class _KeywordCodemod(PatchCodemod):
    CALLEE: str = ""  # the called name, e.g. "SchedulerConfig" (also matches x.SchedulerConfig)
    KEYWORD: str = ""
    FIRST_ARG: str | None = None  # only calls whose first argument is this string literal

    def _targets(self, tree: cst.Module) -> list[cst.Call]:
        found = calls_to(tree, self.CALLEE)
        if self.FIRST_ARG is not None:
            literal = m.SimpleString(f'"{self.FIRST_ARG}"') | m.SimpleString(f"'{self.FIRST_ARG}'")
            found = [c for c in found if c.args and m.matches(c.args[0].value, literal)]
        return found

    def _shape(self) -> str:
        first = f'"{self.FIRST_ARG}", ' if self.FIRST_ARG else ""
        return f"a call {self.CALLEE}({first}...)"

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        targets = self._targets(tree)
        if not targets:
            self.refuse(None, self._shape())
        pending = [c for c in targets if self.needs_change(c)]
        if not pending:
            self.already_satisfied(self.satisfied_reason())
        return tree.visit(_Rewrite(pending, self.change))

    def needs_change(self, call: cst.Call) -> bool:
        raise NotImplementedError

    def refuse_unseen(self, call: cst.Call) -> None:
        """A call without ``KEYWORD=`` but with ``**kwargs``: they may carry it where no codemod
        can see, so the codemod can tell neither that it is needed nor that it is not."""
        splat = next((a for a in call.args if a.star == "**"), None)
        if splat is not None:
            self.refuse(
                splat,
                f"{self._shape()} without **kwargs, or with {self.KEYWORD}= itself (they may carry {self.KEYWORD}=)",
            )

    def change(self, call: cst.Call) -> cst.Call:
        raise NotImplementedError

    def satisfied_reason(self) -> str:
        raise NotImplementedError


class _Rewrite(cst.CSTTransformer):
    def __init__(self, targets: list[cst.Call], change) -> None:
        super().__init__()
        self.targets = {id(t) for t in targets}
        self.change = change

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        return self.change(updated) if id(original) in self.targets else updated


class AddKeyword(_KeywordCodemod):
    """Add ``KEYWORD=VALUE`` to every call of ``CALLEE`` that lacks it.

    An existing ``KEYWORD=`` whose value is one of ``ACCEPTED`` (source text) counts as
    satisfied; any other existing value is refused, never overwritten. A call without the
    keyword but with ``**kwargs`` is refused: they may carry it.
    """

    VALUE: str = ""
    ACCEPTED: tuple[str, ...] = ()

    def needs_change(self, call: cst.Call) -> bool:
        existing = keyword(call, self.KEYWORD)
        if existing is None:
            self.refuse_unseen(call)
            return True
        code = cst.Module([]).code_for_node(existing.value)
        if code not in (self.VALUE, *self.ACCEPTED):
            self.refuse(existing, f"{self.KEYWORD}= absent or one of {(self.VALUE, *self.ACCEPTED)}, found {code}")
        return False

    def change(self, call: cst.Call) -> cst.Call:
        return append_keyword(call, self.KEYWORD, self.VALUE)

    def satisfied_reason(self) -> str:
        return f"{self.CALLEE}(...) already passes {self.KEYWORD}="


class RemoveKeyword(_KeywordCodemod):
    """Remove the ``KEYWORD=`` argument from every call of ``CALLEE`` that has it.

    ``EXPECTED`` (source text): the values of ``KEYWORD=`` the removal is written for; any
    other value is refused, never dropped (empty: any value). A call without the keyword but
    with ``**kwargs`` is refused (they may carry it), as for ``AddKeyword``.
    """

    EXPECTED: tuple[str, ...] = ()

    def needs_change(self, call: cst.Call) -> bool:
        existing = keyword(call, self.KEYWORD)
        if existing is None:
            self.refuse_unseen(call)
            return False
        code = cst.Module([]).code_for_node(existing.value)
        if self.EXPECTED and code not in self.EXPECTED:
            self.refuse(existing, f"{self.KEYWORD}= absent or one of {self.EXPECTED}, found {code}")
        return True

    def change(self, call: cst.Call) -> cst.Call:
        return remove_keyword(call, self.KEYWORD)

    def satisfied_reason(self) -> str:
        return f"{self.CALLEE}(...) no longer passes {self.KEYWORD}="


class Replace(PatchCodemod):
    """Replace every statement or expression matching ``MATCH`` with ``REPLACEMENT``.

    ``REPLACEMENT`` is Python source: statements (dedented; comments above the first are
    kept) when ``MATCH`` matches a statement, else one expression. Already satisfied when
    ``SATISFIED`` matches anywhere in the module; refused when ``MATCH`` matches nowhere
    (``EXPECTED`` names the shape in the refusal). ``TOUCHES``: what the fix is about, more
    widely (e.g. any call of the function ``MATCH`` rewrites in one exact statement); one
    outside every ``MATCH`` is a shape the codemod was not written for, refused by line.
    """

    MATCH: m.BaseMatcherNode
    REPLACEMENT: str = ""
    SATISFIED: m.BaseMatcherNode
    SATISFIED_REASON: str = ""
    EXPECTED: str = ""
    TOUCHES: m.BaseMatcherNode | None = None

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if m.findall(tree, self.SATISFIED):
            self.already_satisfied(self.SATISFIED_REASON)
        found = m.findall(tree, self.MATCH)
        if not found:  # named by line where the code it is about is there in another shape
            touched = m.findall(tree, self.TOUCHES) if self.TOUCHES is not None else []
            self.refuse(touched[0] if touched else None, self.EXPECTED)
        if self.TOUCHES is not None:
            inside = {id(n) for node in found for n in m.findall(node, self.TOUCHES)}
            for node in m.findall(tree, self.TOUCHES):
                if id(node) not in inside:
                    self.refuse(node, self.EXPECTED)
        if isinstance(found[0], cst.BaseStatement):
            return replace_statements(tree, {self.MATCH: self.REPLACEMENT})
        return tree.visit(_ReplaceExpressions(self.MATCH, cst.parse_expression(self.REPLACEMENT)))


class _ReplaceExpressions(cst.CSTTransformer):
    def __init__(self, matcher: m.BaseMatcherNode, replacement: cst.BaseExpression) -> None:
        super().__init__()
        self.matcher, self.replacement = matcher, replacement

    def on_leave(self, original, updated):
        if isinstance(updated, cst.BaseExpression) and m.matches(updated, self.matcher):
            return self.replacement
        return updated


class AddMethod(PatchCodemod):
    """Add the method ``METHOD`` (source of one ``def``, decorators and comments above it
    included, written at column 0) to the module-level class ``CLASS``, just above its method
    ``BEFORE``.

    Already satisfied when the class defines a method of that name doing what ``METHOD``
    does (the same ``ast``: layout and comments do not count); refused when the class defines
    one of that name that does something else (it is the user's or another release's, and
    never overwritten), or when ``CLASS`` or its ``BEFORE`` is not there exactly once.
    """

    CLASS: str = ""
    BEFORE: str = ""
    METHOD: str = ""

    @property
    def name(self) -> str:
        node = cst.parse_statement(self.METHOD)
        assert isinstance(node, cst.FunctionDef)
        return node.name.value

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        classes = [s for s in tree.body if m.matches(s, m.ClassDef(name=m.Name(self.CLASS)))]
        if len(classes) != 1:
            self.refuse(classes[1] if classes else None, f"one module-level class {self.CLASS}")
        cls = classes[0]
        assert isinstance(cls, cst.ClassDef) and isinstance(cls.body, cst.IndentedBlock)
        mine = [s for s in cls.body.body if m.matches(s, m.FunctionDef(name=m.Name(self.name)))]
        if mine:
            if len(mine) == 1 and same_code(mine[0], self.METHOD):
                self.already_satisfied(f"{self.CLASS}.{self.name} is there")
            self.refuse(mine[0], f"no {self.name} of its own in class {self.CLASS}")
        anchors = [i for i, s in enumerate(cls.body.body) if m.matches(s, m.FunctionDef(name=m.Name(self.BEFORE)))]
        if len(anchors) != 1:
            self.refuse(cls, f"one method {self.BEFORE} in class {self.CLASS}")
        method = statements(self.METHOD, [cst.EmptyLine(indent=False)]).nodes
        body = list(cls.body.body)
        at = anchors[0]
        body[at:at] = method
        new_cls = cls.with_changes(body=cls.body.with_changes(body=body))
        return tree.with_changes(body=[new_cls if s is cls else s for s in tree.body])
