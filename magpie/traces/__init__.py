"""Profiler trace analysis. For notebooks: `magpie.traces.open(path)` and
`magpie.traces.comparison(before, after)` (see `notebook.py`), loaded on first use so that
importing the package for the CLI costs nothing more."""

_NOTEBOOK_NAMES = ("open", "comparison", "TraceAnalysis", "TraceComparison")


def __getattr__(name: str):
    if name in _NOTEBOOK_NAMES:
        from magpie.traces import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'magpie.traces' has no attribute {name!r}")
