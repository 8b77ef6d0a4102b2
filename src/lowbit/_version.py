"""lowbit's version, in the bottom layer so that writers can record it without importing the
``lowbit`` package facade (keep it equal to ``pyproject.toml``'s)."""

__version__ = "0.1.0"
