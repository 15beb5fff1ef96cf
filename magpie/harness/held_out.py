"""Held-out shapes: besides the declared shapes, a spec's cases are checked on shapes drawn per
build from its secret seed (same rank and dtype, sizes around the declared ones, neither powers of
two nor multiples of 16), so that a kernel correct only on the shapes it was shown (a tile with no
mask, a size written into the code) is not credited. Every implementation of a kernel gets the same
shapes in a build; the next build's secret draws others.

A function-style spec makes inputs for any shape it is asked (`make_inputs(shape, dtype)`); a
KernelBench problem for the values its `get_inputs()` reads of the module's integer constants
(`batch_size`, `dim`, ...) that neither `get_init_inputs()` nor `Model` reads (those would change
the model). A spec that cannot make a held-out shape, or makes the declared shapes whatever it is
asked, has that shape skipped with a note, never a failure of the implementation."""

from __future__ import annotations

import random

from magpie.harness.spec import Case, ReferenceSpec, SpecError, derive_seed
from magpie.harness.wire import Testcase

# dimensions below this stay as declared: too small to show a tile's edge, and often fixed by
# their meaning (channels, heads, pairs)
SMALLEST_VARIED = 8
# a drawn size is a multiple of none of the tile widths kernels use, powers of two up to this
TILE = 16


def drawn_size(rng: random.Random, size: int) -> int:
    """A size between half and 1.25 times `size`, other than it, neither a power of two nor a
    multiple of TILE; `size` itself where it is below SMALLEST_VARIED."""
    if size < SMALLEST_VARIED:
        return size
    low, high = (size + 1) // 2, size + size // 4
    while True:
        value = rng.randint(low, high)
        if value != size and value % TILE and value & (value - 1):
            return value


def drawn_shapes(declared: list[list[int]], seed: int, count: int) -> list[list[int]]:
    """`count` shapes drawn around each declared one, none of them declared or drawn twice."""
    rng = random.Random(seed)
    drawn: list[list[int]] = []
    for shape in declared:
        for _ in range(count):
            new = [drawn_size(rng, size) for size in shape]
            if new not in declared and new not in drawn:
                drawn.append(new)
    return drawn


def problem_sizes(module) -> dict[str, int]:
    """A KernelBench problem's size constants: the module's integers that get_inputs() reads and
    neither get_init_inputs() nor a method of Model does, in the order get_inputs() names them."""
    get_inputs = getattr(module, "get_inputs", None)
    if get_inputs is None or not hasattr(get_inputs, "__code__"):
        return {}
    elsewhere: set[str] = set()
    init = getattr(module, "get_init_inputs", None)
    if init is not None and hasattr(init, "__code__"):
        elsewhere.update(init.__code__.co_names)
    for member in vars(getattr(module, "Model", object)).values():
        if hasattr(member, "__code__"):
            elsewhere.update(member.__code__.co_names)
    sizes = {}
    for name in get_inputs.__code__.co_names:
        value = vars(module).get(name)
        if type(value) is int and name not in elsewhere:
            sizes[name] = value
    return sizes


def held_out_cases(
    spec: ReferenceSpec, seed: int, kernel_id: str, index: int, testcase: Testcase, init_seed: int
) -> tuple[list[Case], list[str]]:
    """The held-out cases of one testcase (one trial each), each labelled by what it is, and the
    notes on what was skipped and why. Each case's inputs and reference are made once here: a
    shape the spec cannot make is skipped, not charged to the implementation."""
    count = testcase.held_out_shapes
    if count == 0:
        return [], []
    name = spec.path.name
    shape_seed = derive_seed(seed, kernel_id, index, "held-out")
    if spec.kernelbench:
        sizes = problem_sizes(spec.module)
        if not sizes:
            return [], [
                f"{name}: get_inputs() reads no integer size constant of its module that the model does not: "
                "its inputs' shapes are fixed, no held-out shapes"
            ]
        drawn_sizes = [dict(zip(sizes, values)) for values in drawn_shapes([list(sizes.values())], shape_seed, count)]
        planned = [
            Case("held-out", None, None, 0, derive_seed(seed, kernel_id, index, "held-out", s), True, s)
            for s in drawn_sizes
        ]
        declared_case = Case("kernelbench", None, None, 0, seed)
    else:
        planned = [
            Case(f"held-out {_times(s)} {d}", s, d, 0, derive_seed(seed, kernel_id, index, "held-out", s, d), True)
            for s in drawn_shapes(testcase.shapes, shape_seed, count)
            for d in testcase.dtypes
        ]
        declared_case = Case("declared", testcase.shapes[0], testcase.dtypes[0], 0, seed)
    if not planned:
        return [], [f"{name}: no declared dimension of {SMALLEST_VARIED} or more to vary: no held-out shapes"]
    try:
        declared_shapes = _tensor_shapes(spec, spec.make_inputs(declared_case, checked=False))
    except SpecError:
        declared_shapes = None  # the declared cases say what is wrong with it
    cases, notes = [], []
    for case in planned:
        try:
            args = spec.make_inputs(case)
            spec.reference(args, init_seed)
        except SpecError as err:
            notes.append(f"held-out {_described(case)} skipped: the spec cannot make it: {err}")
            continue
        shapes = _tensor_shapes(spec, args)
        if spec.kernelbench:
            case.label = f"held-out {', '.join(_times(s) for s in shapes)}"
        if shapes == declared_shapes:
            notes.append(f"{name}: makes the declared shapes whatever it is asked: no held-out shapes")
            return [], notes
        cases.append(case)
    return cases, notes


def failed_verdict(result: dict) -> dict:
    """A FAILED correctness whose first failure is on a held-out shape says so, declared shapes
    having passed (they are checked first, and a failure there stops the held-out ones)."""
    failed = next((c for c in result.get("checks", []) if not c["passed"]), None)
    if result.get("correctness_state") != "FAILED" or failed is None or not failed.get("held_out"):
        return result
    errors = ""
    if "max_abs_err" in failed:
        errors = f" (max abs err {failed['max_abs_err']:.3g}, max rel err {failed['max_rel_err']:.3g})"
    shape = failed["case"].removeprefix("held-out ")
    verdict = (
        f"incorrect: passes declared shapes, fails held-out {shape}: {failed['check']}: {failed['detail']}{errors}"
    )
    return {**result, "verdict": verdict, "errors": [verdict]}


def _times(shape) -> str:
    return "×".join(str(size) for size in shape)


def _described(case: Case) -> str:
    if case.sizes:
        return " ".join(f"{k}={v}" for k, v in case.sizes.items())
    return case.label.removeprefix("held-out ")


def _tensor_shapes(spec: ReferenceSpec, args: tuple) -> list[list[int]]:
    return [list(a.shape) for a in args if spec.torch.is_tensor(a)]
