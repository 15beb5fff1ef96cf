"""How a timing job times on a GPU: CUDA events per call or replays of a captured graph.
Settled before any probe where the device, the manifest or the baseline's timing decides;
otherwise from what a probe of the workers read."""

from __future__ import annotations

from magpie.harness.timing import GRAPH_THRESHOLD_US


def chosen_method(device: str, mode: str, set_method: dict | None) -> dict | None:
    """The timing method where it is settled before any probe: on the CPU, by the manifest
    (`mode`, its `timing.mode`), or by the baseline's timing for the baseline and every
    candidate (`set_method`, the request's `timing_method`); None: probe."""
    if device == "cpu":
        return {"mode": None, "why": "batches of calls on fresh inputs, timed from outside the worker (CPU device)"}
    if mode != "auto":
        return {"mode": mode, "why": f'timing.mode = "{mode}" in the manifest'}
    if set_method is not None:
        return {**set_method, "why": f"{set_method['why']}; chosen by the baseline's timing"}
    return None


def probed_method(
    probes: dict[str, float], launches: dict[str, float | None] | None = None, is_baseline: bool = False
) -> dict:
    """From device time per call (a short graph replay, free of launch overhead) and the
    host's time to queue a call (`launch_probe`), per role: graph mode under
    GRAPH_THRESHOLD_US, or where the host takes longer to queue a call than the device to run
    it (launch-bound: per-call events would time the host's launch path, which varies with the
    host's load: a 17.5 µs-kernel baseline read 66-178 µs across one build's jobs on the
    H200). The baseline's own timing decides for its kernel's set; a candidate whose baseline
    was not timed decides from the faster of its pair."""
    fastest = min(probes, key=lambda role: probes[role])
    probe_us = probes[fastest]
    launch_us = (launches or {}).get(fastest)
    who = "the baseline" if is_baseline else f"the {fastest} (no timed baseline to follow)"
    launched = f", launched in {launch_us:.3g} µs" if launch_us is not None else ""
    if probe_us < GRAPH_THRESHOLD_US:
        mode, why = "graph", f"{who} probed {probe_us:.3g} µs per call, under {GRAPH_THRESHOLD_US:g} µs"
    elif launch_us is not None and launch_us > probe_us:
        mode, why = (
            "graph",
            (
                f"{who} takes {launch_us:.3g} µs to launch a call that runs {probe_us:.3g} µs on "
                "the device: launch-bound"
            ),
        )
    else:
        mode, why = (
            "events",
            (f"{who} probed {probe_us:.3g} µs per call, at or over {GRAPH_THRESHOLD_US:g} µs{launched}"),
        )
    return {
        "mode": mode,
        "probe_us": round(probe_us, 3),
        "launch_us": round(launch_us, 3) if launch_us is not None else None,
        "why": why,
    }
