"""The base class of every codemod in ``patches/``: libcst's visitor codemod plus two verdicts.

Kept apart from ``patcher.fixes.patch`` (the metadata) so that reading the patch list, which
``status``, ``verify`` and ``--version`` do, never imports libcst.
"""

from __future__ import annotations

import libcst as cst
from libcst.codemod import SkipFile, VisitorBasedCodemodCommand
from libcst.metadata import PositionProvider

from patcher.errors import PatchRefused


class PatchCodemod(VisitorBasedCodemodCommand):
    """Base class for our codemods: libcst's visitor codemod plus two verdicts.

    Subclasses use matchers in ``leave_*``/``visit_*`` and call ``self.already_satisfied``
    or ``self.refuse`` from ``transform_module_impl`` checks. Positions are available
    through ``PositionProvider`` for refusal messages.
    """

    # Positions cost a full pass per codemod, so they are only resolved to word a refusal:
    # the engine re-runs a refusing codemod with ``with_positions()``.
    METADATA_DEPENDENCIES: tuple = ()

    @classmethod
    def with_positions(cls) -> type[PatchCodemod]:
        # libcst caches inherited dependencies in a class attribute; a subclass would
        # inherit the parent's cached (empty) set, so set the cache explicitly.
        deps = (PositionProvider,)
        return type(
            cls.__name__,
            (cls,),
            {
                "METADATA_DEPENDENCIES": deps,
                "_INHERITED_METADATA_DEPENDENCIES_CACHE": frozenset(deps),
            },
        )

    def already_satisfied(self, why: str) -> None:
        """Stop: the code already has the fix. Raises ``libcst.codemod.SkipFile``."""
        raise SkipFile(f"already satisfied: {why}")

    def refuse(self, node: cst.CSTNode | None, expected: str) -> None:
        """Stop without changing anything. Raises ``PatchRefused`` naming file:line."""
        where, line = self.context.filename or "<source>", None
        if node is not None:
            try:
                line = self.get_metadata(PositionProvider, node).start.line
            except KeyError:  # positions not resolved on this run
                pass
        rest = f"unrecognised code, expected {expected}"
        raise PatchRefused(f"{where}{'' if line is None else f':{line}'}: {rest}", where, line, rest)
