"""analyze and compare as library calls: a one-kernel project made from options (the CLI's
flags) or a Magpie-style YAML config, built by the same engine as `magpie build`, in a
workspace under the output folder; `analyze()` and `compare()` return their reports (also
written there). Nothing is printed but through the `Progress` passed; cli/analyze.py and
cli/compare.py parse flags and print."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from magpie.errors import UserError
from magpie.execution.progress import Progress

# Jobs at once by default, at most: each holds an evaluator and a worker, on a GPU each with
# its CUDA context (about half a GiB of device memory).
JOBS_CAP = 16

# analyze_report.json's keys taken from the implementation's comparison row
STATE_KEYS = (
    "compiling_state",
    "correctness_state",
    "performance_state",
    "performance_result",
    "numerics",
    "verdict",
    "errors",
    "warnings",
    "failures",
    "flags",
    "numerics_margin",
    "time_s",
)


class OneShotOptions:
    """What `magpie analyze` / `magpie compare` are asked to do; the flags of the same names
    (cli/oneshot.py) say each."""

    def __init__(
        self,
        *,
        paths: list[str] | None = None,
        kernel_config: str | None = None,
        type: str | None = None,
        entry: str | None = None,
        testcase: str | None = None,
        spec: str | None = None,
        shapes: str = "",
        timed_shapes: str = "",
        dtypes: str = "float32",
        rtol: float | None = None,
        atol: float | None = None,
        no_perf: bool = False,
        trust_code: bool = False,
        no_profile: bool = False,
        budget_ms: float = 300.0,
        timeout: float = 120.0,
        device: str = "cpu",
        output_dir: str | Path = "magpie_results",
        jobs: int | None = None,
    ):
        self.paths = list(paths or [])
        self.kernel_config = kernel_config
        self.type = type
        self.entry = entry
        self.testcase = testcase
        self.spec = spec
        self.shapes = shapes
        self.timed_shapes = timed_shapes
        self.dtypes = dtypes
        self.rtol = rtol
        self.atol = atol
        self.no_perf = no_perf
        self.trust_code = trust_code
        self.no_profile = no_profile
        self.budget_ms = budget_ms
        self.timeout = timeout
        self.device = device
        self.output_dir = output_dir
        self.jobs = jobs


class OneShotResult:
    """A report (analyze_report.json's or compare_report.json's contents) and where it was written."""

    def __init__(self, report: dict, path: Path):
        self.report = report
        self.path = path


def analyze(options: OneShotOptions, progress: Progress | None = None) -> OneShotResult:
    """Judge one kernel (compile, correctness, timing)."""
    from magpie.report.models import AnalyzeReport, checked
    from magpie.supervision import zygote

    _start_pool(options)  # these calls always evaluate
    with zygote.session(prestart=True):
        project, out = one_kernel_project(options, "analyze", baseline_index=None)
        comparison = _build_and_read_comparison(project, options, progress)
    row = comparison["results"][0]
    report = {"kernel": row["implementation"], **{k: row.get(k) for k in STATE_KEYS}}
    kernel = project.manifest.kernel[0]
    report["type"] = kernel.impl_type(kernel.baseline)
    report["source"] = kernel.baseline.source
    path = out / "analyze_report.json"
    write_json(path, checked(AnalyzeReport, report))
    return OneShotResult(report, path)


def compare(options: OneShotOptions, baseline: int = 0, progress: Progress | None = None) -> OneShotResult:
    """Check every implementation, exclude incorrect ones, time the rest interleaved with the
    baseline (index `baseline` among the implementations) and judge their speedups."""
    from magpie.supervision import zygote

    _start_pool(options)
    with zygote.session(prestart=True):
        project, out = one_kernel_project(options, "compare", baseline_index=baseline)
        report = _build_and_read_comparison(project, options, progress)
    path = out / "compare_report.json"
    write_json(path, report)
    return OneShotResult(report, path)


def default_jobs(implementations: int) -> int:
    """A job slot per implementation: its correctness job, then its timing, which mostly wait
    for the device; with fewer slots than implementations the last checks wait for a slot
    instead of starting beside the others."""
    return max(1, min(os.cpu_count() or 1, JOBS_CAP, max(2, implementations)))


def _start_pool(options: OneShotOptions) -> None:
    """jobs checked before any work; the job pool's server started where jobs will run in it:
    it imports the job code, as the zygote torch, while the project is set up."""
    from magpie.execution import pool

    if options.jobs is not None and options.jobs < 1:
        raise UserError("--jobs: must be at least 1")
    pool.prestart(options.jobs or default_jobs(len(options.paths)))


def _shapes(text: str, flag: str = "--shapes") -> list[list[int]]:
    from magpie.manifest.models import check_shape

    shapes = []
    for part in filter(None, (s.strip() for s in text.split(","))):
        try:
            shape = [int(d) for d in part.lower().split("x")]
        except ValueError:
            raise UserError(f"{flag}: {part!r} is not a shape like 64x1024") from None
        try:
            check_shape(shape)
        except ValueError as err:
            raise UserError(f"{flag}: {err}") from None
        shapes.append(shape)
    return shapes


def implementations(options: OneShotOptions) -> tuple[list[tuple[dict, str]], list[dict], Path]:
    """[(implementation table, type)], testcase tables, project root."""
    if options.kernel_config:
        from magpie.manifest.kernel_config import load_kernel_config

        kernels, root = load_kernel_config(options.kernel_config)
        impls = [(k.impl.model_dump(exclude_none=True), k.type) for k in kernels]
        testcases = [tc.model_dump(exclude_none=True) for tc in kernels[0].testcases]
        return impls, testcases, root
    if not options.paths:
        raise UserError("give kernel source files, or --kernel-config YAML")
    if not options.type:
        raise UserError("--type: required with source paths (pytorch, triton, cuda or hip)")
    root = Path.cwd()
    impls = []
    for path in options.paths:
        full = Path(path).resolve()
        if not full.is_file():
            raise UserError(f"{path}: file not found")
        impl = {"id": full.stem, "source": _relative(full, root)}
        if options.entry:
            impl["entry"] = options.entry
        impls.append((impl, options.type))
    testcases = []
    if options.testcase:
        testcases.append({"command": options.testcase})
    if options.spec:
        if not Path(options.spec).is_file():
            raise UserError(f"--spec: file not found: {options.spec}")
        tc = {
            "spec": _relative(Path(options.spec).resolve(), root),
            "shapes": _shapes(options.shapes),
            "dtypes": [d.strip() for d in options.dtypes.split(",") if d.strip()],
        }
        testcases.append(tc)
    return impls, testcases, root


def _relative(full: Path, root: Path) -> str:
    try:
        return full.relative_to(root).as_posix()
    except ValueError:
        return full.as_posix()


def one_kernel_project(options: OneShotOptions, kernel_id: str, baseline_index: int | None):
    from pydantic import ValidationError

    from magpie.manifest.load import check_files, describe_validation_error
    from magpie.manifest.models import Manifest
    from magpie.project import Project

    impls, testcases, root = implementations(options)
    ids = [impl["id"] for impl, _ in impls]
    if len(set(ids)) != len(ids):
        raise UserError(f"implementation names must differ (got {ids}); rename the files")
    kernel_type = impls[0][1]
    tables = [{**impl, "type": t} for impl, t in impls]
    kernel: dict = {"id": kernel_id, "type": kernel_type, "testcases": testcases}
    if options.rtol is not None:
        kernel["rtol"] = options.rtol
    if options.atol is not None:
        kernel["atol"] = options.atol
    if baseline_index is not None:
        if not 0 <= baseline_index < len(tables):
            raise UserError(f"--baseline: index {baseline_index} is out of range 0..{len(tables) - 1}")
        kernel["baseline"] = tables[baseline_index]
        kernel["candidates"] = [t for i, t in enumerate(tables) if i != baseline_index]
    else:
        kernel["baseline"] = tables[0]
    out = Path(options.output_dir)
    declared = _shapes(options.shapes)
    for shape in _shapes(options.timed_shapes, "--timed-shapes"):
        if shape not in declared:
            shown = "x".join(map(str, shape))
            raise UserError(f"--timed-shapes: {shown} is not among --shapes ({options.shapes or 'none given'})")
    document = {
        "project": {"name": kernel_id, "workspace": str((out / "workspace").resolve()), "device": options.device},
        "defaults": {
            "timeout_s": options.timeout,
            "timing": {
                "budget_ms": options.budget_ms,
                **({"shapes": _shapes(options.timed_shapes, "--timed-shapes")} if options.timed_shapes else {}),
            },
        },
        "kernel": [kernel],
    }
    try:
        manifest = Manifest.model_validate(document)
    except ValidationError as err:
        raise describe_validation_error(options.kernel_config or "command line", err) from None
    check_files(manifest, root, options.kernel_config or "command line")
    _check_entries(manifest.kernel[0], root, options.kernel_config)
    project = Project.from_manifest(
        manifest, root, Path(options.kernel_config or "command line"), workspace=out / "workspace"
    )
    dropped = {"timing"} if options.no_perf else set()
    dropped |= {"profile"} if options.no_perf or options.no_profile else set()
    if dropped:
        for name in [n for n, spec in project.tasks.items() if spec.rule in dropped]:
            del project.tasks[name]
        for spec in project.tasks.values():
            spec.deps = [d for d in spec.deps if d in project.tasks]
    return project, out


def _check_entries(kernel, root: Path, kernel_config: str | None) -> None:
    """Refuse, before anything is evaluated, an implementation the worker could not load:
    with no entry named it takes a ModelNew or Model class (KernelBench), and there is none."""
    from magpie.manifest.models import PYTHON_TYPES

    loads_code = not kernel.testcases or any(tc.spec for tc in kernel.testcases)  # commands load nothing
    if not loads_code:
        return
    for impl in kernel.implementations():
        if kernel.impl_type(impl) not in PYTHON_TYPES or impl.entry or kernel.entry:
            continue
        if _binds_a_model_class(root / impl.source):
            continue
        if kernel_config:
            raise UserError(
                f"{kernel_config}: kernel {impl.id!r}: no entry, and {impl.source} has no ModelNew or "
                f"Model class: add 'entry: NAME', the function to evaluate"
            )
        raise UserError(
            f"{impl.source}: no --entry given and no ModelNew or Model class in it: "
            f"pass --entry NAME, the function to evaluate"
        )


def _binds_a_model_class(source: Path) -> bool:
    """Whether the module may define ModelNew or Model (as the worker looks them up: any name)."""
    try:
        tree = ast.parse(source.read_bytes())
    except (SyntaxError, ValueError):
        return True  # the compile step reports a file that does not parse, in its own words
    wanted = {"ModelNew", "Model"}
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in wanted:
            return True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in wanted:
            return True
        if isinstance(node, ast.alias) and (node.name == "*" or (node.asname or node.name) in wanted):
            return True
    return False


def _build_and_read_comparison(project, options: OneShotOptions, progress: Progress | None) -> dict:
    from magpie.execution.build import build_selected

    jobs = options.jobs
    if jobs is None:
        jobs = default_jobs(sum(1 for spec in project.tasks.values() if spec.rule == "correctness"))
    if options.trust_code:
        from magpie import sandbox

        sandbox.admit(True)
    build_selected(project, list(project.tasks), jobs=jobs, progress=progress, summarize=False)
    comparison = next(spec for spec in project.tasks.values() if spec.rule == "comparison")
    if not project.store.has(comparison.key):
        raise UserError("the evaluation did not complete; see the messages above")
    return project.store.read(comparison.key)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
