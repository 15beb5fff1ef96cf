"""magpie build: bring every stale artifact of the project up to date."""

from __future__ import annotations

import json
import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "build",
        help="build stale artifacts (compile, correctness, timing, comparison, report)",
        description="Build the artifacts of magpie.toml that are out of date. Editing one "
        "candidate re-runs only its tasks and the comparison and report above them.",
    )
    p.add_argument("targets", nargs="*", help="kernel ids or task names (default: everything)")
    p.add_argument("-m", "--manifest", default="magpie.toml", help="project manifest (default: %(default)s)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="independent tasks run in parallel (default: 1)")
    p.add_argument(
        "--executor",
        choices=("inline", "local", "ray"),
        help="where jobs run (default: inline for -j 1, a local process pool otherwise; ray: each job a Ray task)",
    )
    p.add_argument(
        "--devices",
        help="GPU indices to place jobs on, e.g. 0,1 (default: [project] devices, else every visible GPU)",
    )
    p.add_argument(
        "--ray-address",
        help="with --executor ray: the cluster to join (auto, ray://host:port; default: start a local Ray)",
    )
    p.add_argument(
        "--cache",
        help="a shared cache folder: what the store lacks is taken from it, each artifact checked first "
        "(default: [store] cache of magpie.toml, else none)",
    )
    p.add_argument(
        "--cache-write",
        action="store_true",
        default=None,
        help="also put what the build made into the cache (needs a trusted signer; read-only by default)",
    )
    p.add_argument("-n", "--dry-run", action="store_true", help="list what would run and why, run nothing")
    p.add_argument(
        "--force",
        action="store_true",
        help="run the targets (task names or kernel ids) again even where up to date; what depends on "
        "their results follows",
    )
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument(
        "--json",
        action="store_true",
        help="print a JSON summary on stdout at the end: per implementation its verdict, failure kinds "
        "and speedup, the report paths, the check (the same schema for a no-op)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when an implementation failed (compile, correctness, timing), timed out, was "
        "inconclusive or not judged (a spec error), when one declared expect_faster is not faster, "
        "or when a task failed (for CI; a no-op build checks the stored verdicts)",
    )
    p.add_argument(
        "--trust-code",
        action="store_true",
        help="run code under test without a sandbox where the host allows none (only code you trust)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="hash every artifact first and rebuild any modified since it was written (otherwise one "
        "whose files' stat is unchanged since its digest was last checked is trusted unread)",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    from magpie.execution.build import Build, BuildOptions
    from magpie.execution.progress import Progress

    devices = None
    if args.devices is not None:
        from magpie.execution.devices import parse_devices

        devices = parse_devices(args.devices)
    if args.ray_address is not None and args.executor != "ray":
        from magpie.errors import UserError

        raise UserError("--ray-address: only with --executor ray")
    options = BuildOptions(
        targets=args.targets,
        manifest=args.manifest,
        jobs=args.jobs,
        executor=args.executor,
        devices=devices,
        ray_address=args.ray_address,
        force=args.force,
        verify=args.verify,
        trust_code=args.trust_code,
        check=args.check,
        summarize=args.json,
        cache=args.cache,
        cache_write=args.cache_write,
    )
    build = Build(options, Progress(sys.stderr, bar=sys.stderr.isatty() and not args.plain))
    if args.dry_run:
        plan = build.dry_run()
        if args.json:
            print(
                json.dumps(
                    {"would_run": [{"task": n, "why": w} for n, w in plan.would_run], "up_to_date": plan.up_to_date},
                    indent=1,
                )
            )
        else:
            for name, why in plan.would_run:
                print(f"would run  {name}  ({why})")
            print(f"{len(plan.would_run)} to run, {plan.up_to_date} up to date")
        return 0
    with build.stopped_by_sigterm():
        result = build.run()
    summary = result.summary  # built with one: --json and --check ask for it
    if args.json:
        assert summary is not None
        print(summary.model_dump_json(indent=1))
    else:
        print(result.line)
        if args.check:
            assert summary is not None
            problems = summary.check.problems
            for problem in problems:
                print(f"check: {problem}")
            print(
                "magpie: check passed" if result.check_passed else f"magpie: check failed: {len(problems)} problem(s)"
            )
    return result.exit_code
