"""magpie loop: where the optimization loop of a project's [[benchmark]] stands, what is stale, the next step."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "loop",
        help="where the optimization loop stands for a [[benchmark]]: what is done, what is stale, the next step",
        description="For a project with a [[benchmark]]: whether its baseline is benchmarked, its top bottlenecks "
        "found (a profiled run's trace analysis), kernels declared for them, their candidates judged (the "
        "winner) and the winner validated in the workload (the A/B: change, interval, gate); which of those "
        "steps a build would run again (as `magpie build --dry-run` says), and the one next step as a command. "
        "Runs nothing.",
    )
    p.add_argument("-m", "--manifest", default="magpie.toml", help="project manifest (default: %(default)s)")
    p.add_argument("-b", "--benchmark", help="the [[benchmark]]'s id (default: the first)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    from magpie.execution.loop import loop_status, render
    from magpie.project import Project

    status = loop_status(Project.load(args.manifest), args.benchmark)
    print(status.model_dump_json(indent=1) if args.json else render(status))
    return 0
