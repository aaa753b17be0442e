"""The ``tenure`` command: one module per command (``demo``, ``listings`` for
``tasks`` and ``locks``, ``release``, ``doctor`` with ``schema``, ``web``), the
helpers they share (``common``), and the parser (``main``)."""

from .main import main

__all__ = ("main",)
