"""magpie clean: remove artifacts from the store."""

from __future__ import annotations

import shutil


def add_parser(sub) -> None:
    p = sub.add_parser(
        "clean",
        help="remove artifacts (of given kernels, or all with --all)",
        description="Remove the current artifacts of the given kernels (and the report that "
        "depends on them); with no kernel, of the whole project; --all empties the store. "
        "Cleaning a benchmark stops the servers the project's build kept (keep_server).",
    )
    p.add_argument("kernels", nargs="*", help="kernel ids or task names")
    p.add_argument("-m", "--manifest", default="magpie.toml", help="project manifest (default: %(default)s)")
    p.add_argument(
        "--all",
        action="store_true",
        help="remove the whole store, index, kept inputs, published reports and the graph snapshot",
    )
    p.set_defaults(run=run)


def run(args) -> int:
    from magpie.graph import last_load, snapshot
    from magpie.graph.expand import known
    from magpie.project import Project

    project = Project.load(args.manifest)
    store = project.store
    names = [] if args.all else project.select(args.kernels)
    if args.all or any(project.tasks[name].scope == "benchmark" for name in names):
        from magpie.serving.lifecycle import stop_all
        from magpie.serving.local import ServerError

        try:
            lines = stop_all(project=str(project.root))
        except ServerError as err:  # the records' folder is unusable: the artifacts still go
            lines = [f"warning: {err}"]
        for line in lines:
            print(f"magpie: {line}")
    if args.all:
        for folder in (store.objects, store.index, store.snapshots, store.workspace / "reports"):
            shutil.rmtree(folder, ignore_errors=True)
        store.file_digests_path.unlink(missing_ok=True)
        snapshot.path_for(project.manifest_path, project.manifest.project.workspace).unlink(missing_ok=True)
        last_load.path_for(store.workspace).unlink(missing_ok=True)  # its kept inputs' bytes are gone
        print(f"magpie: removed the store under {store.workspace}")
        return 0
    if args.kernels:
        names += [n for n, spec in project.tasks.items() if spec.scope == "project"]
    removed = 0
    for name in names:
        # under its current key, and under the key of its last build (which a task whose
        # dependency has no artifact, its key unknown, still has in the store)
        recorded = store.recorded(name) or {}
        keys = {project.tasks[name].key, recorded.get("key")}
        for key in {key for key in keys if isinstance(key, str) and known(key)}:
            removed += store.remove(key)
        store.forget(name)
    from magpie.report.publish import unpublish

    unpublish(project, project.with_dependents(names))
    print(f"magpie: removed {removed} artifacts")
    return 0
