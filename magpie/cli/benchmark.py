"""magpie benchmark: a serving engine under load (`magpie benchmark ENGINE -m MODEL ...`), or the gap
analysis of existing traces (`--trace-dir`)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from magpie.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "benchmark",
        help="benchmark a serving engine (ENGINE -m MODEL), or analyze PyTorch "
        "profiler traces (--trace-dir): where GPU time goes",
        description="With ENGINE and -m MODEL: start the engine's server (or reach --base-url), "
        "send it vLLM bench-serve load and write benchmark_report.json, "
        "bench_serve_result.json, server.log and benchmark_config.json to -o DIR. "
        "With --trace-dir: gap analysis of existing PyTorch profiler traces (Chrome JSON, "
        ".json or .json.gz, one file per rank): the kernels that take the GPU time in a "
        "window, by total contribution, with the CPU op and input shapes that launched "
        "them, and a GPU timeline per device. Writes gap_analysis/gap_analysis.csv (+ per "
        "rank), gap_analysis/gap_analysis.json and gpu_timeline.csv.",
    )
    p.add_argument(
        "framework",
        nargs="?",
        choices=("transformers", "vllm", "sglang", "atom", "external"),
        metavar="ENGINE",
        help="transformers, vllm, sglang, atom, or external (with --base-url; the default there)",
    )
    s = p.add_argument_group("serving benchmark")
    s.add_argument("-m", "--model", help="model folder or hub id the engine serves (and the requests name)")
    s.add_argument(
        "--benchmark-config",
        metavar="YAML",
        help="Magpie's benchmark: YAML (framework, model, precision, "
        "envs TP/CONC/ISL/OSL/..., run_kind, gpu_selection, timeout_seconds) instead of ENGINE -m MODEL",
    )
    s.add_argument("-p", "--precision", default="auto", help="auto, bf16, fp16, fp32, fp8, ... (default: auto)")
    s.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default: 1)")
    s.add_argument("--max-model-len", type=int, help="the server's maximum sequence length")
    s.add_argument("--extra-server-args", default="", metavar="ARGS", help="appended to the server's command line")
    s.add_argument("--host", default="127.0.0.1", help="where the local server listens (default: %(default)s)")
    s.add_argument("--port", type=int, help="the local server's port (default: the engine's: 8000, sglang 30000)")
    s.add_argument(
        "--base-url",
        help="a running server to benchmark: nothing is started; with no ENGINE (external) "
        "any OpenAI-compatible server: only OpenAI's standard request fields are sent, "
        "so output lengths are the server's; name its engine to have its way of fixing "
        "them (vllm, sglang: ignore_eos)",
    )
    s.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    s.add_argument("--concurrency", type=int, help="requests in flight at most (default: no limit)")
    s.add_argument(
        "--input-len",
        type=int,
        default=1024,
        help="random prompts' length in tokens of --tokenizer (default: %(default)s)",
    )
    s.add_argument("--output-len", type=int, default=128, help="tokens asked of each request (default: %(default)s)")
    s.add_argument("--random-range-ratio", type=float, default=0.0, help="lengths uniform over len*(1±ratio)")
    s.add_argument("--random-prefix-len", type=int, default=0, help="tokens of a prefix shared by every prompt")
    s.add_argument(
        "--tokenizer",
        help="the tokenizer lengths are counted in: a folder or a hub id in the local cache "
        "(default: the model's own; none to be had: words, the report's tokenizer null)",
    )
    s.add_argument("--num-prompts", type=int, default=100, help="requests in the run (default: %(default)s)")
    s.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="AXIS=V1,V2,...",
        help="run the benchmark at each value of concurrency, request_rate, input_len or output_len (several "
        "--sweep: every combination) against one server kept up across the points; writes sweep_report.json, "
        "sweep_report.html and sweep_pareto.svg (output throughput per GPU against interactivity) to -o DIR",
    )
    s.add_argument("--repeats", type=int, metavar="N", help="runs of each sweep point, for its intervals (default: 3)")
    s.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (default: all at once)")
    s.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrivals (1: Poisson)")
    s.add_argument("--num-warmups", type=int, default=0, help="requests before the measured run")
    s.add_argument("--goodput", nargs="+", default=[], metavar="NAME:MS", help="SLOs: ttft:MS tpot:MS e2el:MS")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        metavar="S",
        help="the whole benchmark, server start included (default: %(default)s)",
    )
    s.add_argument("--ready-timeout", type=float, metavar="S", help="the server's start alone (default: --timeout)")
    s.add_argument(
        "--torch-profiler",
        action="store_true",
        help="record a torch profiler window over the load into -o DIR/torch_trace/ (vllm, sglang: their "
        "/start_profile and /stop_profile; transformers: magpie's launcher) and analyse it into "
        "tracelens/ and gap_analysis/; the run is diagnostic, never reward-eligible",
    )
    s.add_argument(
        "--keep-server",
        action="store_true",
        help="leave the local server running after a clean run and reuse a kept one whose recorded config "
        "(engine and version, model content, command line, environment, port) matches; otherwise "
        "the stale one is stopped and a fresh one started (Magpie's server_lifecycle: reuse)",
    )
    s.add_argument(
        "--stop-servers",
        action="store_true",
        help="stop every server kept by --keep-server (or keep_server), and those containers and servers "
        "that magpie runs killed before their end left running, and exit",
    )
    s.add_argument(
        "--run-mode",
        choices=("local", "docker"),
        help="local: the server as our own process group (default); docker: in a container of the "
        "engine's image (magpie/serving/images.yaml, per engine and GPU kind), --network host",
    )
    s.add_argument(
        "--docker-image",
        metavar="IMG",
        help="docker mode's image instead of images.yaml's (it must be on this machine: nothing is pulled)",
    )
    s.add_argument(
        "--gpus", metavar="IDS", help="pin the server's GPUs, e.g. 0,1 (default: idle GPUs are picked, as many as --tp)"
    )
    s.add_argument(
        "--compare",
        nargs=2,
        metavar=("A", "B"),
        help="compare two serving runs (benchmark_report.json files or run folders; several joined by "
        "commas are repeats): refused unless their workloads are equivalent",
    )
    p.add_argument("--trace-dir", required=False, metavar="DIR", help="folder of trace files")
    p.add_argument(
        "--compare-traces",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="compare two sets of traces per op signature and per kernel: time before and after, "
        "difference, ratio, new and vanished; each side is a trace file, a folder of traces or "
        "several of either joined by commas (A1.json.gz,A2.json.gz), and several traces on a side "
        "are repeats of one run: each row then says whether its change is beyond the spread "
        "between repeats. Writes trace_compare.csv, .json and .html to -o DIR; --top-k rows "
        "per table are printed",
    )
    p.add_argument("--top-k", type=int, default=20, help="kernels to report (default: %(default)s)")
    p.add_argument("--start-pct", type=float, default=0.0, help="window start, percent of the GPU span")
    p.add_argument("--end-pct", type=float, default=100.0, help="window end, percent of the GPU span")
    p.add_argument(
        "--steady-state",
        action="store_true",
        help="window each trace to its repeating steps (numbered annotations), first and last left out",
    )
    p.add_argument(
        "--analysis-mode",
        choices=("pytorch", "inference"),
        default="pytorch",
        help="pytorch: the whole-trace report; inference: also split serving traces into steps and "
        "stages (prefill, decode, prefilldecode) from the engine's step annotations (vLLM's "
        "execute_context_..._generation_...; a stage word beside a step number) or the call tree's "
        "repetition, with per-stage outputs under tracelens/<trace>/<stage>/ (default: %(default)s)",
    )
    p.add_argument(
        "--include-category",
        default="",
        help="only these categories, comma separated "
        "(gemm, attention, norm, softmax, reduction, copy, "
        "elementwise, communication, memcpy, memset, other)",
    )
    p.add_argument("--exclude-category", default="", help="leave out these categories, comma separated")
    p.add_argument("--min-duration-us", type=float, default=0.0, help="leave out kernels shorter on average")
    p.add_argument(
        "--arch",
        help="accelerator for the roofline when the trace does not name one "
        "(H100, H200, B200, A100, MI300X, MI325X, MI355X)",
    )
    p.add_argument(
        "--find-kernel-sources",
        action="store_true",
        help="map each top kernel to its source (Triton @triton.jit, CUDA/HIP __global__) or library",
    )
    p.add_argument(
        "--kernel-source-repos",
        nargs="+",
        default=[],
        metavar="PATH",
        help="repositories to index for --find-kernel-sources",
    )
    p.add_argument("-o", "--output-dir", default="magpie_results", help="where the analysis is written")
    p.add_argument("--json", action="store_true", help="print the JSON summary")
    p.set_defaults(run=run)


def _categories(text: str) -> set[str] | None:
    return {c.strip() for c in text.split(",") if c.strip()} or None


def run(args) -> int:
    if args.stop_servers:
        from magpie.serving import docker_mode
        from magpie.serving.lifecycle import stop_all

        lines = stop_all()
        try:
            lines += docker_mode.sweep(docker_mode.connect())
        except docker_mode.DockerError:
            pass  # no daemon (or no SDK): no container of ours can be running
        for line in lines or ["no kept servers"]:
            print(line)
        return 0
    if args.compare:
        from magpie.serving.compare import main as compare_main

        if args.framework or args.model or args.trace_dir or args.compare_traces or args.benchmark_config:
            raise UserError("--compare A B: give it alone (no ENGINE, -m, --trace-dir or --compare-traces)")
        return compare_main(args.compare, as_json=args.json)
    if args.compare_traces:
        if args.framework or args.model or args.trace_dir:
            raise UserError("--compare-traces BEFORE AFTER: give it alone (no ENGINE, -m or --trace-dir)")
        return run_compare(args)
    if args.framework or args.model or args.benchmark_config:
        if args.trace_dir:
            raise UserError("give either ENGINE -m MODEL (a serving benchmark) or --trace-dir (trace analysis)")
        return run_serving(args)
    return run_traces(args)


def run_serving(args) -> int:
    from pydantic import ValidationError

    from magpie.serving.models import parse_goodput
    from magpie.serving.report import BenchmarkConfig

    if args.benchmark_config:
        from magpie.serving.bench_config import load_benchmark_config

        if args.framework or args.model:
            raise UserError("benchmark: give either --benchmark-config YAML or ENGINE -m MODEL, not both")
        config = load_benchmark_config(
            args.benchmark_config,
            output_dir=args.output_dir,
            host=args.host,
            port=args.port,
            base_url=args.base_url,
            endpoint=args.endpoint,
            profiler=args.torch_profiler or None,
            run_mode=args.run_mode,
            docker_image=args.docker_image,
            tokenizer=args.tokenizer,
            prefix_len=args.random_prefix_len or None,
            server_lifecycle="reuse" if args.keep_server else None,
        )
        _refuse_missing_model(config, f"{args.benchmark_config}: benchmark.model")
        from magpie.serving.bench_config import load_benchmark_sweep

        axes, repeats = load_benchmark_sweep(args.benchmark_config)
        if args.sweep:  # the command line's sweep over the YAML's
            axes = _cli_sweep(args.sweep)
        if axes is not None:
            return _sweep_and_print(config, axes, repeats if args.repeats is None else args.repeats, args)
        if args.repeats is not None:
            raise UserError("--repeats: the runs of each sweep point; give --sweep AXIS=V1,V2,... too")
        return _serve_and_print(config, args)
    if args.repeats is not None and not args.sweep and not args.benchmark_config:
        raise UserError("--repeats: the runs of each sweep point; give --sweep AXIS=V1,V2,... too")
    if not args.framework and args.base_url:
        args.framework = "external"
    if not args.framework:
        raise UserError("benchmark -m MODEL: name the engine first: transformers, vllm, sglang, atom or external")
    if not args.model:
        raise UserError(f"benchmark {args.framework}: give the model with -m MODEL")
    try:
        config = BenchmarkConfig(
            framework=args.framework,
            model=args.model,
            precision=args.precision,
            tp=args.tp,
            max_model_len=args.max_model_len,
            extra_server_args=shlex.split(args.extra_server_args),
            host=args.host,
            port=args.port,
            base_url=args.base_url,
            endpoint=args.endpoint,
            concurrency=args.concurrency,
            input_len=args.input_len,
            output_len=args.output_len,
            range_ratio=args.random_range_ratio,
            num_prompts=args.num_prompts,
            request_rate=args.request_rate,
            prefix_len=args.random_prefix_len,
            tokenizer=args.tokenizer,
            burstiness=args.burstiness,
            num_warmups=args.num_warmups,
            seed=args.seed,
            goodput=parse_goodput(args.goodput),
            timeout_s=args.timeout,
            ready_timeout_s=args.ready_timeout,
            output_dir=args.output_dir,
            profiler=args.torch_profiler,
            run_mode=args.run_mode or "local",
            docker_image=args.docker_image,
            server_lifecycle="reuse" if args.keep_server else "fresh",
        )
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "config"
        raise UserError(f"benchmark: {where}: {first['msg']}") from None
    except ValueError as err:
        raise UserError(f"benchmark: {err}") from None
    _refuse_missing_model(config, "-m")
    if args.sweep:
        return _sweep_and_print(config, _cli_sweep(args.sweep), args.repeats, args)
    return _serve_and_print(config, args)


def _cli_sweep(values: list[str]):
    from magpie.manifest.sweep_axes import parse_sweep

    try:
        return parse_sweep(values)
    except ValueError as err:
        raise UserError(str(err)) from None


def _sweep_and_print(config, axes, repeats: int | None, args) -> int:
    from magpie.serving.sweep import DEFAULT_REPEATS, SWEEP_REPORT, run_sweep
    from magpie.serving.sweep_plot import markdown_table

    if args.gpus:
        from magpie.serving.gpus import pin_env

        config = config.model_copy(update={"env": {**config.env, **pin_env(args.gpus)}})
    where = Path(config.output_dir).resolve() / SWEEP_REPORT
    try:
        report = run_sweep(config, axes, DEFAULT_REPEATS if repeats is None else repeats)
    except ValueError as err:
        raise UserError(f"benchmark --sweep: {err}") from None
    except KeyboardInterrupt:
        print(f"magpie: sweep interrupted; report of the points run: {where}", file=sys.stderr)
        raise
    if args.json:
        print(json.dumps(report.model_dump(mode="json"), indent=1))
    else:
        print(markdown_table(report))
        if report.server is not None:
            print(
                f"server: {report.server.starts} start(s) for {sum(len(p.repeats) for p in report.points)} runs"
                f"{', kept' if report.server.kept else ''}"
            )
    if not report.success:
        print(
            f"magpie: sweep failed: {report.errors[0] if report.errors else 'incomplete'}; report: {where}",
            file=sys.stderr,
        )
        return 1
    if not args.json:
        print(f"written: {where}")
    return 0


def _refuse_missing_model(config, where: str) -> None:
    """A model written as a path (`/`, `./`, `~`, two slashes) that is not there: one line before anything starts."""
    from magpie.manifest.load import local_model_path

    if config.base_url is not None or config.framework == "external":
        return  # a running server's model name, not a folder of ours
    path = local_model_path(config.model)
    if path is not None and not path.exists():
        raise UserError(
            f"{where}: no model folder {config.model}: give the folder holding the model "
            f"(config.json, weights) or a hub id (org/name)"
        )


def _serve_and_print(config, args) -> int:
    from magpie.serving.runner import REPORT, run_benchmark

    if args.gpus:
        from magpie.serving.gpus import pin_env

        config = config.model_copy(update={"env": {**config.env, **pin_env(args.gpus)}})
    where = Path(config.output_dir).resolve() / REPORT
    try:
        report = run_benchmark(config)
    except KeyboardInterrupt:
        print(f"magpie: benchmark interrupted; report (partial where requests had completed): {where}", file=sys.stderr)
        raise
    if args.json:
        print(json.dumps(report.model_dump(mode="json"), indent=1))
    if not report.success:
        first = report.errors[0] if report.errors else "no request completed"
        print(f"magpie: benchmark failed: {first}; report: {where}", file=sys.stderr)
        return 1
    if not args.json:
        lat, thr, counts = report.latency, report.throughput, report.run
        assert thr is not None and counts is not None  # a successful run has both
        print(
            f"{report.framework} {report.model}: {counts.completed} requests in {counts.duration_s:.2f} s, "
            f"{thr.request_throughput:.2f} req/s, {thr.output_throughput:.1f} output tok/s"
        )
        for name in ("ttft", "tpot", "itl", "e2el"):
            st = getattr(lat, name)
            if st.mean is None:  # no request gave one (a TPOT needs two tokens or more)
                print(f"  {name:5} none")
            else:
                print(f"  {name:5} mean {st.mean:9.2f} ms  median {st.median:9.2f}  p99 {st.p99:9.2f}")
        if report.profiling_enabled:
            gap = report.gap_analysis or {}
            print(
                f"profiled (diagnostic, not reward-eligible): {len(gap.get('traces', []))} trace(s), "
                f"{gap.get('kernels', 0)} GPU kernels -> {Path(report.workspace_dir) / 'torch_trace'}"
            )
            if gap.get("explanation"):
                print(f"  {gap['explanation']}")
        print(f"written: {where}")
    return 0


def run_compare(args) -> int:
    from magpie.traces.compare import compare_traces, format_table
    from magpie.traces.ingest import TraceError

    if args.top_k < 1:
        raise UserError("--top-k: must be at least 1")
    try:
        before, after = args.compare_traces
        summary = compare_traces(before, after, args.output_dir)
    except TraceError as err:
        raise UserError(f"--compare-traces: {err}") from None
    print(json.dumps(summary, indent=1) if args.json else format_table(summary, args.top_k))
    return 0


def run_traces(args) -> int:
    from magpie.traces.gap import Window
    from magpie.traces.ingest import TraceError
    from magpie.traces.report import analyze_traces

    if not args.trace_dir:
        raise UserError("benchmark: give ENGINE -m MODEL (a serving benchmark) or --trace-dir DIR (trace analysis)")
    if not 0 <= args.start_pct < args.end_pct <= 100:
        raise UserError("--start-pct/--end-pct: need 0 <= start < end <= 100")
    if args.top_k < 1:
        raise UserError("--top-k: must be at least 1")
    if args.find_kernel_sources and not args.kernel_source_repos:
        raise UserError("--find-kernel-sources: give the repositories to search with --kernel-source-repos PATH...")
    missing = [r for r in args.kernel_source_repos if not os.path.isdir(r)]
    if missing:
        raise UserError(f"--kernel-source-repos: not a folder: {missing[0]}")
    if args.arch:
        from magpie.roofline.specs import ARCHES, lookup

        if lookup(args.arch) is None:
            raise UserError(f"--arch: unknown accelerator {args.arch!r} (known: {', '.join(a.name for a in ARCHES)})")
    try:
        summary = analyze_traces(
            args.trace_dir,
            args.output_dir,
            top_k=args.top_k,
            window=Window(args.start_pct, args.end_pct),
            include=_categories(args.include_category),
            exclude=_categories(args.exclude_category),
            min_duration_us=args.min_duration_us,
            arch_name=args.arch,
            source_repos=args.kernel_source_repos if args.find_kernel_sources else None,
            steady_state=args.steady_state,
            analysis_mode=args.analysis_mode,
        )
    except TraceError as err:
        raise UserError(str(err)) from None
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    total = summary["total_kernel_time_us"]
    where = "the steady-state windows" if args.steady_state else f"the window [{args.start_pct:g}%, {args.end_pct:g}%]"
    print(f"{len(summary['traces'])} trace(s), {total / 1000:.2f} ms of kernel time in {where}")
    for pick in summary["window_picks"]:
        if pick["picked"]:
            print(f"steady state of {pick['trace']}: {pick['reason']}")
    ranks = len(summary["traces"]) > 1  # several ranks ranked together: say whose each row is
    if summary["top"]:
        print(f"{'rank ' if ranks else ''}{'% Total':>8} {'total us':>10} {'calls':>6} {'category':12} name")
    for row in summary["top"]:
        source = f"  [{row['Source State']}: {row['Source']}]" if "Source State" in row else ""
        rank = f"{row['Rank']:>4} " if ranks else ""
        print(
            f"{rank}{row['% Total']:8.2f} {row['Self CUDA total (us)']:10.1f} {row['Calls']:6d} {row['Category']:12} "
            f"{row['Normalized Name'][:80]}{source}"
        )
    for label, stages in summary["tracelens_analysis"]["per_stage"].items():
        for stage, info in stages.items():
            print(
                f"{label} {stage}: {info['kept_steps']} of {info['steps']} steps, "
                f"{info['kernel_time_us'] / 1000:.2f} ms of kernel time -> {Path(info['files'][0]).parent}"
            )
    for warning in summary["warnings"]:
        print(f"warning: {warning}")
    print(f"written: {summary['outputs']['gap_analysis']}")
    return 0
