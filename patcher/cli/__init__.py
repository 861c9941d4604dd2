"""The command line: ``app`` (options, one target or a fan-out, exit codes), ``reports`` (each
verb's data as printed), ``render`` (console, tables, advice), ``fanout`` (several hosts)."""

from patcher.cli.app import main
from patcher.cli.render import Report

__all__ = ["Report", "main"]
