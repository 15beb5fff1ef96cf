"""Where code under test keeps what its compilers made, and what magpie compiles for it.

Every implementation's workers get compiler caches of their own, keyed by what they load: code
under test writes into its own, never into one another implementation reads (a shared Triton
cache let one candidate replace another's compiled kernels). A new cache costs a Triton
worker's first call what Triton makes once per cache or once per process, none of it the
candidate's: on the H200, 0.45 s hashing Triton's own compiler (libtriton.so, 500 MB) for its
cache key, and 0.3-0.4 s compiling its driver utilities (a C module) into the cache. The
zygote computes the first before it forks (`warm_triton`); an evaluator compiles the second
once into a folder of its own and copies it into each new cache (`seed_triton_cache`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import sys
from pathlib import Path

from magpie.paths import cache_root


def implementation_caches(key: str) -> Path:
    """Where the compiler caches of one implementation's workers live, keyed by what they load."""
    return cache_root() / "compiled" / key


def compiler_caches(base: Path) -> dict[str, str]:
    """The variables that put Triton's, CUDA's and torch extensions' caches under `base`, the
    folders made."""
    folders = {
        "TRITON_CACHE_DIR": base / "triton",
        "CUDA_CACHE_PATH": base / "cuda",
        "TORCH_EXTENSIONS_DIR": base / "torch_extensions",
    }
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {name: str(folder) for name, folder in folders.items()}


def warm_triton() -> None:
    """Triton's key of its own compiler, computed here, in the zygote, for every process it
    forks (Triton keeps it for the process's life): not where Triton runs in its interpreter
    (it compiles nothing) or where there is no GPU to compile for."""
    if "triton" not in sys.modules or os.environ.get("TRITON_INTERPRET") or not _gpu_nodes():
        return
    key = triton_key_function()
    if key is not None:
        key()


def triton_key_function():
    """Triton's function (lru-cached) for the key of its own compiler, where this version keeps
    it; None where it keeps none."""
    for name in ("triton.runtime.cache", "triton.compiler.compiler"):
        try:
            key = getattr(importlib.import_module(name), "triton_key", None)
        except ImportError:
            continue
        if callable(key):
            return key
    return None


def _gpu_nodes() -> bool:
    """Whether the host shows a GPU's device node, asked without making CUDA's state (the zygote forks)."""
    from magpie import sandbox

    return bool(sandbox.nvidia_gpu_nodes()) or os.path.exists("/dev/kfd")


@functools.lru_cache(maxsize=1)
def triton_driver_utilities() -> Path | None:
    """The folder holding Triton's driver utilities as this process compiled them (an
    evaluator's: it runs no code under test), made the first time; None where Triton has no
    active GPU driver here or had loaded them already (nothing would be compiled into it)."""
    try:
        import triton
    except ImportError:
        return None
    folder = (
        cache_root()
        / "triton-driver"
        / hashlib.sha256(f"{triton.__version__} {triton.__file__} {sys.version}".encode()).hexdigest()[:24]
    )
    previous = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(folder)  # Triton reads it when it builds a module
    try:
        _ = triton.runtime.driver.active.utils  # the attribute's first read loads the driver's helpers
    except Exception:  # no GPU driver for Triton here: its workers compile their own, as without this
        return None
    finally:
        if previous is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = previous
    return folder if folder.is_dir() and any(folder.iterdir()) else None


def seed_triton_cache(cache: Path) -> None:
    """The driver utilities copied into an implementation's Triton cache, each file replaced
    whole (a worker may be loading it): a copy that code under test changed in its own cache
    is put right for the next worker."""
    template = triton_driver_utilities()
    if template is not None:
        seed_from(template, cache)


def seed_from(template: Path, cache: Path) -> None:
    for source in template.rglob("*"):
        # Triton writes a file into a "tmp.pid_..." folder, then moves it: one under way is left
        if not source.is_file() or any(part.startswith("tmp.") for part in source.relative_to(template).parts):
            continue
        target = cache / source.relative_to(template)
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f".{target.name}.{os.getpid()}.part")
        part.write_bytes(source.read_bytes())
        os.replace(part, target)
