"""Output checks. Each returns a record naming the check that failed and by how much."""

from __future__ import annotations


def as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _fail(check: str, detail: str, kind: str | None = None, **errors) -> dict:
    """kind: the machine-readable name (harness/kinds.py), the check's own where it is one word."""
    return {"passed": False, "check": check, "kind": kind or check, "detail": detail, **errors}


class UnexpectedOutput(Exception):
    """An output of a form the checks do not judge (sparse, nested, on another device, of a
    Tensor subclass), found in the worker before it is handed over: the implementation's
    failure. `kind` is its failure kind (harness/kinds.py)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


def output_form(torch, value, index: int, device=None) -> tuple[str, str] | None:
    """(kind, detail) when a tensor output is not a plain dense tensor on `device` (where one is
    given), else None. Its strides are not judged: a transposed or channels_last output holds
    the same values, and the checks compare values."""
    if type(value) not in (torch.Tensor, torch.nn.Parameter):
        return "type", (
            f"output {index} is a {type(value).__name__} (a subclass of torch.Tensor); a plain torch.Tensor is expected"
        )
    if value.is_nested:
        return "layout", f"output {index} is a nested tensor; a dense tensor is expected"
    if value.layout != torch.strided:
        layout = str(value.layout)
        what = "a sparse tensor" if "sparse" in layout else "a tensor of another layout"
        return "layout", f"output {index} is {what} ({layout}); a dense tensor is expected"
    if device is not None and value.device != torch.device(device):
        return "device", f"output {index} is on {value.device}; the inputs are on {torch.device(device)}"
    return None


def check_output_forms(torch, outputs: list, inputs: list) -> None:
    """In the worker, before outputs are copied out (which would make a sparse output dense and
    move one on another device to the evaluator's): each call's tensor outputs plain, dense and
    on its inputs' device. Raises UnexpectedOutput."""
    for produced, args in zip(outputs, inputs):
        device = next((x.device for x in as_tuple(args) if torch.is_tensor(x)), None)
        for i, value in enumerate(as_tuple(produced)):
            if torch.is_tensor(value):
                odd = output_form(torch, value, i, device)
                if odd is not None:
                    raise UnexpectedOutput(*odd)


def compare_outputs(got, expected, rtol: float, atol: float) -> dict:
    import torch

    got_t, exp_t = as_tuple(got), as_tuple(expected)
    if len(got_t) != len(exp_t):
        return _fail(
            "output count", kind="output_count", detail=f"returned {len(got_t)} outputs, expected {len(exp_t)}"
        )
    # tolerance_used: the largest |got - expected| / (atol + rtol |expected|), 1 at the allclose bound
    worst = {"max_abs_err": 0.0, "max_rel_err": 0.0, "rel_err_norm": 0.0, "tolerance_used": 0.0}
    for i, (g, e) in enumerate(zip(got_t, exp_t)):
        where = f"output {i}: " if len(exp_t) > 1 else ""
        if not torch.is_tensor(e):
            if g != e:
                return _fail("value", f"{where}got {g!r}, expected {e!r}")
            continue
        if not torch.is_tensor(g):
            return _fail("type", f"{where}got {type(g).__name__}, expected a tensor")
        odd = output_form(torch, g, i)  # what the worker's own check (check_output_forms) let through
        if odd is not None:
            return _fail(odd[0], odd[1])
        if tuple(g.shape) != tuple(e.shape):
            return _fail("shape", f"{where}shape {list(g.shape)}, expected {list(e.shape)} (no broadcasting)")
        if g.dtype != e.dtype:
            return _fail("dtype", f"{where}dtype {g.dtype}, expected {e.dtype}")
        if not e.is_floating_point() and not e.is_complex():
            mismatched = int((g != e).sum())
            if mismatched:
                return _fail(
                    "values",
                    kind="exact",
                    detail=f"{where}{mismatched} of {e.numel()} elements differ (exact match needed)",
                )
            continue
        g64, e64 = g.double(), e.double()
        if bool(torch.isfinite(e).all()):  # the usual case: no element to leave out (a mask copies)
            got_bad = ~torch.isfinite(g64)
            if bool(got_bad.any()):
                return _fail(
                    "finite",
                    f"{where}{int(got_bad.sum())} of {e.numel()} elements are NaN/Inf where "
                    "the reference is finite (unwritten output memory reads as NaN)",
                )
            diff = (g64 - e64).abs()
            ref = e64.abs()
            kept = e64
        else:
            expected_finite = torch.isfinite(e64)
            bad = expected_finite & ~torch.isfinite(g64)
            if bad.any():
                return _fail(
                    "finite",
                    f"{where}{int(bad.sum())} of {e.numel()} elements are NaN/Inf where "
                    "the reference is finite (unwritten output memory reads as NaN)",
                )
            diff = (g64 - e64).abs()[expected_finite]
            ref = e64.abs()[expected_finite]
            kept = e64[expected_finite]
        max_abs = float(diff.max()) if diff.numel() else 0.0
        max_rel = float((diff / ref.clamp_min(1e-30)).max()) if diff.numel() else 0.0
        used = float((diff / (atol + rtol * ref).clamp_min(1e-30)).max()) if diff.numel() else 0.0
        ref_norm = float(kept.norm())
        rel_norm = float(diff.norm()) / ref_norm if ref_norm > 0 else float(diff.norm())
        worst = {
            k: max(worst[k], v)
            for k, v in (
                ("max_abs_err", max_abs),
                ("max_rel_err", max_rel),
                ("rel_err_norm", rel_norm),
                ("tolerance_used", used),
            )
        }
        close = torch.isclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            return _fail(
                "allclose",
                f"{where}{int((~close).sum())} of {e.numel()} elements outside rtol={rtol:g} atol={atol:g}",
                None,
                **worst,
            )
        rms = float(ref.pow(2).mean().sqrt()) if ref.numel() else 0.0
        norm_bound = rtol + (atol / rms if rms > 0 else 0.0)
        if rel_norm > norm_bound:
            return _fail(
                "error norm",
                kind="error_norm",
                detail=f"{where}relative error norm {rel_norm:.3g} > {norm_bound:.3g}",
                **worst,
            )
    return {"passed": True, "check": "all", "detail": "", **worst}


# `surely_close` passes only what `compare_outputs` passes with this much to spare (its float32
# arithmetic is off by parts per million, never by this).
SURE_MARGIN = 0.99


def surely_close(got, expected, rtol: float, atol: float) -> bool:
    """Whether outputs pass `compare_outputs` beyond doubt, in a few float32 passes and one
    synchronisation where it takes some twenty in float64 and as many (a timed batch's checks of
    16 Mi-element outputs took longer on the H200 than its calls). False is no verdict: where it
    says False, `compare_outputs` decides and says why."""
    import torch

    got_t, exp_t = as_tuple(got), as_tuple(expected)
    if len(got_t) != len(exp_t):
        return False
    verdicts = []
    for g, e in zip(got_t, exp_t):
        if not (
            torch.is_tensor(g)
            and torch.is_tensor(e)
            and output_form(torch, g, 0) is None
            and g.shape == e.shape
            and g.dtype == e.dtype
            and e.is_floating_point()
        ):
            return False
        g32, e32 = (g, e) if e.dtype in (torch.float32, torch.float64) else (g.float(), e.float())
        diff = (g32 - e32).abs_()  # NaN or Inf anywhere fails every comparison below
        ref = e32.abs()
        within = diff.le(ref.mul(rtol).add_(atol).mul_(SURE_MARGIN)).all()
        # the error norm's bound, (rtol + atol / rms) |e|, times |e|; a reference of zeros, or
        # one not all finite, is left to `compare_outputs`
        ref_norm = torch.linalg.vector_norm(ref)
        bound = SURE_MARGIN * (rtol * ref_norm + atol * e.numel() ** 0.5)
        within_norm = torch.isfinite(ref_norm) & (ref_norm > 0) & (torch.linalg.vector_norm(diff) <= bound)
        verdicts.append(within & within_norm)
    return bool(torch.stack(verdicts).all()) if verdicts else False


def compare_inputs(before: tuple, after: tuple) -> dict | None:
    import torch

    for i, (b, a) in enumerate(zip(before, after)):
        if torch.is_tensor(b) and not (a.shape == b.shape and torch.equal(a, b)):
            return _fail(
                "inputs unchanged", kind="mutation", detail=f"input {i} was modified in place by the implementation"
            )
    return None


def all_finite(got) -> dict:
    import torch

    for i, g in enumerate(as_tuple(got)):
        if not torch.is_tensor(g):
            return _fail("type", f"output {i} is {type(g).__name__}, expected a tensor")
        odd = output_form(torch, g, i)
        if odd is not None:
            return _fail(odd[0], odd[1])
        if g.is_floating_point() and not torch.isfinite(g).all():
            return _fail("finite", f"output {i} has {int((~torch.isfinite(g)).sum())} NaN/Inf elements")
    return {"passed": True, "check": "finite only", "detail": ""}
