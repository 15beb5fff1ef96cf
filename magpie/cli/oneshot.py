"""What analyze and compare share: a one-kernel project made from flags or a YAML config,
built by the same engine as `magpie build`, in a workspace under the output folder."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

from magpie.errors import UserError


# Jobs at once by default, at most: each holds an evaluator and a worker, on a GPU each with
# its CUDA context (about half a GiB of device memory).
JOBS_CAP = 16


def default_jobs(implementations: int) -> int:
    """A job slot per implementation: its correctness job, then its timing, which mostly wait
    for the device; with fewer slots than implementations the last checks wait for a slot
    instead of starting beside the others."""
    return max(1, min(os.cpu_count() or 1, JOBS_CAP, max(2, implementations)))


def start_pool(args) -> None:
    """--jobs checked before any work; the job pool's server started where jobs will run in it:
    it imports the job code, as the zygote torch, while the project is set up."""
    from magpie.execution import pool  # not at import: every verb's module loads for --help

    if args.jobs is not None and args.jobs < 1:
        raise UserError("--jobs: must be at least 1")
    pool.prestart(args.jobs or default_jobs(len(args.paths)))


def add_common(p, paths_help: str) -> None:
    p.add_argument("paths", nargs="*", help=paths_help)
    p.add_argument("--kernel-config", metavar="YAML", help="Magpie-style YAML (kernel: or kernels:)")
    p.add_argument("--type", choices=("pytorch", "triton", "cuda", "hip"), help="kernel type of the sources")
    p.add_argument("--entry", help="callable in the source to evaluate (default: ModelNew/Model class)")
    p.add_argument("--testcase", metavar="CMD", help="command whose exit code decides correctness")
    p.add_argument("--spec", metavar="FILE", help="Python reference spec (make_inputs/reference, or KernelBench)")
    p.add_argument("--shapes", default="", help="shapes for --spec, e.g. 64x1024,37x1000")
    p.add_argument("--dtypes", default="float32", help="dtypes for --spec, comma separated (default: float32)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default 1e-5)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default 1e-6)")
    p.add_argument("--no-perf", action="store_true", help="correctness only, no timing")
    p.add_argument("--trust-code", action="store_true",
                   help="run the code without a sandbox where the host allows none (only code you trust)")
    p.add_argument("--no-profile", action="store_true", help="no hardware counters (ncu/rocprofv3) on a GPU")
    p.add_argument("--budget-ms", type=float, default=300.0, help="timed milliseconds per implementation")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per evaluation step")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("-o", "--output-dir", default="magpie_results", help="reports and artifact store go here")
    p.add_argument("-j", "--jobs", type=int,
                   help=f"independent tasks in parallel (default: one per implementation, at least 2, at most "
                        f"the CPU count and {JOBS_CAP}); checks share the device, measurements hold it alone")


def _shapes(text: str) -> list[list[int]]:
    from magpie.manifest.models import check_shape

    shapes = []
    for part in filter(None, (s.strip() for s in text.split(","))):
        try:
            shape = [int(d) for d in part.lower().split("x")]
        except ValueError:
            raise UserError(f"--shapes: {part!r} is not a shape like 64x1024") from None
        try:
            check_shape(shape)
        except ValueError as err:
            raise UserError(f"--shapes: {err}") from None
        shapes.append(shape)
    return shapes


def implementations_from_args(args) -> tuple[list[tuple[dict, str]], list[dict], Path]:
    """[(implementation table, type)], testcase tables, project root."""
    if args.kernel_config:
        from magpie.manifest.kernel_config import load_kernel_config

        kernels, root = load_kernel_config(args.kernel_config)
        impls = [(k.impl.model_dump(exclude_none=True), k.type) for k in kernels]
        testcases = [tc.model_dump(exclude_none=True) for tc in kernels[0].testcases]
        return impls, testcases, root
    if not args.paths:
        raise UserError("give kernel source files, or --kernel-config YAML")
    if not args.type:
        raise UserError("--type: required with source paths (pytorch, triton, cuda or hip)")
    root = Path.cwd()
    impls = []
    for path in args.paths:
        full = Path(path).resolve()
        if not full.is_file():
            raise UserError(f"{path}: file not found")
        impl = {"id": full.stem, "source": _relative(full, root)}
        if args.entry:
            impl["entry"] = args.entry
        impls.append((impl, args.type))
    testcases = []
    if args.testcase:
        testcases.append({"command": args.testcase})
    if args.spec:
        if not Path(args.spec).is_file():
            raise UserError(f"--spec: file not found: {args.spec}")
        tc = {"spec": _relative(Path(args.spec).resolve(), root), "shapes": _shapes(args.shapes),
              "dtypes": [d.strip() for d in args.dtypes.split(",") if d.strip()]}
        testcases.append(tc)
    return impls, testcases, root


def _relative(full: Path, root: Path) -> str:
    try:
        return full.relative_to(root).as_posix()
    except ValueError:
        return full.as_posix()


def build_project(args, kernel_id: str, baseline_index: int | None):
    from pydantic import ValidationError

    from magpie.manifest.load import check_files, describe_validation_error
    from magpie.manifest.models import Manifest
    from magpie.project import Project

    impls, testcases, root = implementations_from_args(args)
    ids = [impl["id"] for impl, _ in impls]
    if len(set(ids)) != len(ids):
        raise UserError(f"implementation names must differ (got {ids}); rename the files")
    kernel_type = impls[0][1]
    tables = [{**impl, "type": t} for impl, t in impls]
    kernel: dict = {"id": kernel_id, "type": kernel_type, "testcases": testcases}
    if args.rtol is not None:
        kernel["rtol"] = args.rtol
    if args.atol is not None:
        kernel["atol"] = args.atol
    if baseline_index is not None:
        if not 0 <= baseline_index < len(tables):
            raise UserError(f"--baseline: index {baseline_index} is out of range 0..{len(tables) - 1}")
        kernel["baseline"] = tables[baseline_index]
        kernel["candidates"] = [t for i, t in enumerate(tables) if i != baseline_index]
    else:
        kernel["baseline"] = tables[0]
    out = Path(args.output_dir)
    document = {
        "project": {"name": kernel_id, "workspace": str((out / "workspace").resolve()), "device": args.device},
        "defaults": {"timeout_s": args.timeout, "timing": {"budget_ms": args.budget_ms}},
        "kernel": [kernel],
    }
    try:
        manifest = Manifest.model_validate(document)
    except ValidationError as err:
        raise describe_validation_error(args.kernel_config or "command line", err) from None
    check_files(manifest, root, args.kernel_config or "command line")
    _check_entries(manifest.kernel[0], root, args.kernel_config)
    project = Project.from_manifest(manifest, root, Path(args.kernel_config or "command line"),
                                    workspace=out / "workspace")
    dropped = {"timing"} if args.no_perf else set()
    dropped |= {"profile"} if args.no_perf or args.no_profile else set()
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
            raise UserError(f"{kernel_config}: kernel {impl.id!r}: no entry, and {impl.source} has no ModelNew or "
                            f"Model class: add 'entry: NAME', the function to evaluate")
        raise UserError(f"{impl.source}: no --entry given and no ModelNew or Model class in it: "
                        f"pass --entry NAME, the function to evaluate")


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


def run_and_collect(project, jobs: int | None, verb: str, trust_code: bool = False) -> dict:
    from magpie.cli.build import build

    if jobs is None:
        jobs = default_jobs(sum(1 for spec in project.tasks.values() if spec.rule == "correctness"))
    if trust_code:
        from magpie import sandbox

        sandbox.admit(True)
    build(project, list(project.tasks), jobs=jobs, quiet=True, use_rich=sys.stderr.isatty(), title=f"magpie {verb}")
    comparison = next(spec for spec in project.tasks.values() if spec.rule == "comparison")
    if not project.store.has(comparison.key):
        raise UserError("the evaluation did not complete; see the messages above")
    return project.store.read(comparison.key)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
