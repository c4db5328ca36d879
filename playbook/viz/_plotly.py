"""plotly.io without nbformat's 2 s import in every kernel.

``plotly.io._renderers`` imports nbformat at import time, only to check its version in
``plotly.io.show()``; nbformat imports jsonschema, whose format checkers import rfc3987_syntax,
which builds a grammar on import (1.8-3.1 s per kernel on a 2-core machine). A figure shown by
``display()``, its repr or a ``FigureWidget`` never needs nbformat, so plotly.io is imported with
nbformat out of reach and given a stand-in that imports the real one the first time ``show()`` reads it.
"""

import importlib
import sys
import types


class _LazyNbformat(types.ModuleType):
    """The real nbformat, imported on first attribute access (plotly's ``show()`` reads ``__version__``)."""

    def __getattr__(self, name):
        return getattr(importlib.import_module("nbformat"), name)


def import_plotly_io():
    """``plotly.io``, imported (once) without importing nbformat when nothing has imported it yet."""
    if "plotly.io._renderers" in sys.modules or "nbformat" in sys.modules:
        import plotly.io

        return plotly.io
    from _plotly_utils import optional_imports  # its _not_importable set is private: read with getattr

    sys.modules["nbformat"] = None  # an import of it raises ImportError: plotly records it as absent
    try:
        import plotly.io._renderers  # plotly.io loads it lazily: load it here, while nbformat is out of reach
    finally:
        del sys.modules["nbformat"]
        getattr(optional_imports, "_not_importable", set()).discard("nbformat")
    sys.modules["plotly.io._renderers"].nbformat = _LazyNbformat("nbformat")
    return plotly.io


pio = import_plotly_io()
