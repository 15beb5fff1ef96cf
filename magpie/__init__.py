"""magpie: a declarative build system for GPU kernel evaluation.

Importing this package stays cheap on purpose: torch, triton and numpy are only
imported inside the subprocesses that evaluate kernels.
"""

__version__ = "0.1.0"
