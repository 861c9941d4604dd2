"""The console a report prints on: rich's ``Console``, saying each way out in the text it
prints (``patcher.ways``) with this run's target options (``say``: ``cli.options.Advice.say``),
escaped where the text is rich markup. Every string printed, a table's cells too, passes
through ``render_str``; so a report prints the verb's text as it came, and the command
line words it once, here."""

from __future__ import annotations

from typing import Any, Callable

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from patcher import ways
from patcher.ways import Way


class WordedConsole(Console):
    """A ``Console`` whose strings have their ways out said by ``say``."""

    def __init__(self, *args: Any, say: Callable[[Way], str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.say = say or Way.plain

    def render_str(self, text: str, *, markup: bool | None = None, **kwargs: Any) -> Text:
        markup = self._markup if markup is None else markup
        said = (lambda way: escape(self.say(way))) if markup else self.say
        return super().render_str(ways.render(text, said), markup=markup, **kwargs)


def stderr_like(console: Console) -> WordedConsole:
    """A console on standard error that says ways out as ``console`` does (a report's error line)."""
    return WordedConsole(stderr=True, highlight=False, soft_wrap=True, say=getattr(console, "say", None))
