"""Plain doit over the repository's own magpie.toml: `doit list`, `doit`, `doit -n 2 -P thread`.

`magpie build` is the same graph with progress, explanations and the report published;
this file shows the graph is an ordinary doit graph.
"""

from magpie.execution.build import input_secret
from magpie.execution.doit_glue import doit_fields
from magpie.execution.executors import InlineExecutor
from magpie.project import Project

DOIT_CONFIG = {"dep_file": "workspaces/.doit.db", "verbosity": 0, "default_tasks": ["report"]}


def _group(rule: str, fields: list[dict]):
    def generator():
        for item in fields:
            basename, _, sub = item["name"].partition(":")
            yield {**item, "name": sub} if sub else {**item, "basename": basename, "name": None}

    generator.__name__ = f"task_{rule}"
    generator.__doc__ = fields[0]["doc"]
    return generator


def _load_groups() -> dict:
    project = Project.load("magpie.toml")
    groups: dict[str, list[dict]] = {}
    # no secret of its own (plain doit draws none): MAGPIE_INPUT_SECRET's where it is set
    for fields in doit_fields(project, InlineExecutor(), secret=input_secret(evaluates=False)):
        groups.setdefault(fields["name"].partition(":")[0], []).append(fields)
    return {f"task_{rule}": _group(rule, items) for rule, items in groups.items()}


globals().update(_load_groups())
