"""What a Triton worker's first call makes once per process or once per cache, made by a spare
(`harness.spares`) before any job asks for it.

On the H200 (Triton 3.6), an edited candidate's first call in a spare took 0.55 s: 0.2 s
before its kernel's compile began (the compiler's per-process start: its MLIR context and
dialects, LLVM, the ptxas version), 0.05 s compiling, then 0.23 s compiling its launcher (a C
module per kernel signature, built with the system's C compiler, kept in the Triton cache).
A spare compiles a small kernel of magpie's own, which starts the compiler in its process,
and the launchers of the signatures its implementation's worker launched, which it learned
from that worker (`Recorder`). The launchers land in the spare's cache, which becomes the
edited content's (`spares.take_caches`), and are found there by key: the hash of the
launcher's C source, which Triton generates from the signature alone. A signature is data
from code under test: it is checked to be a list of Triton's type names, and a launcher made
for one is found only by a kernel whose own signature makes the same source. Where Triton
has no per-signature launcher (3.9 has one for every kernel), only the compiler is started.
"""

from __future__ import annotations

import re
import sys
import traceback

# How many signatures a spare builds launchers for, of how many arguments at most.
MOST_SIGNATURES = 4
MOST_ARGUMENTS = 64
# Triton's argument type names: pointers (`*fp32`, `*kbf16`: const), scalars (`i32`, `fp8e4nv`,
# `u1`), `constexpr`, `nvTmaDesc`. Triton maps each to C itself (and refuses one it does not know).
TYPE_NAME = re.compile(r"(\*k?)?[a-zA-Z][a-zA-Z0-9]{0,15}")


def signatures(given) -> list[list[str]]:
    """The launch signatures in `given` (a worker's answer) that are lists of Triton's type
    names, at most MOST_SIGNATURES of them, each once; anything else is left out."""
    if not isinstance(given, list):
        return []
    kept: list[list[str]] = []
    for signature in given:
        if (
            isinstance(signature, list)
            and 0 < len(signature) <= MOST_ARGUMENTS
            and all(isinstance(t, str) and TYPE_NAME.fullmatch(t) for t in signature)
            and signature not in kept
        ):
            kept.append(signature)
        if len(kept) == MOST_SIGNATURES:
            break
    return kept


class Recorder:
    """Triton's post-compile hook in a worker: the signatures of the kernels compiled (or
    found in the cache) in this process, in order, each once."""

    def __init__(self):
        self.signatures: list[list[str]] = []

    def install(self) -> None:
        if "triton" not in sys.modules:  # not imported by the zygote: no Triton here
            return
        runtime = getattr(getattr(sys.modules["triton"], "knobs", None), "runtime", None)
        if runtime is not None and hasattr(runtime, "jit_post_compile_hook"):
            runtime.jit_post_compile_hook = self

    def __call__(self, *, compile: dict, **_) -> None:
        signature = [t for t in (compile.get("signature") or {}).values()]
        if (
            len(self.signatures) < MOST_SIGNATURES
            and all(isinstance(t, str) for t in signature)
            and signature not in self.signatures
        ):
            self.signatures.append(signature)


def warm(given: list[list[str]]) -> None:
    """Start Triton's compiler in this process by compiling magpie's own kernel, then build the
    launchers of the given signatures into its cache (TRITON_CACHE_DIR); what fails is printed
    (the worker's first call makes it then, as without this). Work for the host's CPU alone."""
    try:
        from magpie.harness import warmup_kernel

        warmup_kernel.compile_it()
    except Exception:  # noqa: BLE001 - a warm-up: the first call starts the compiler, as without this
        traceback.print_exc()
    try:
        import torch
        from triton.backends.nvidia import driver
    except ImportError:
        return
    # NVIDIA's launchers only, and only where Triton makes one per signature (3.9 has one for every kernel)
    if torch.version.hip is not None or not hasattr(driver, "make_launcher"):
        return
    for signature in signatures(given):
        try:
            source = driver.make_launcher({}, dict(enumerate(signature)), None)
            # as CudaLauncher builds it: its key, the source's hash, is the one a kernel of this signature looks up
            driver.compile_module_from_src(
                src=source,
                name="__triton_launcher",
                library_dirs=driver.library_dirs(),
                include_dirs=driver.include_dirs,
                libraries=driver.libraries,
            )
        except Exception:  # noqa: BLE001 - the first launch builds it, as without this
            traceback.print_exc()
