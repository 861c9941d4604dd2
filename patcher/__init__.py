"""speculators-patch: make an installed speculators (0.3.0, 0.4.x) work with the installed vLLM."""

__version__ = "0.1.0"
