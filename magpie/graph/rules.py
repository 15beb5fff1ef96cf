"""Rules: declarative descriptions of how one kind of artifact is made.

Built-in rules live in the top-level `rules/` folder; a project's `[[rule]]` tables
override fields of the built-in rule with the same name and types, or add new rules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from magpie.errors import UserError, located
from magpie.manifest.load import describe_validation_error, parse_toml
from magpie.paths import rules_dir

Scope = Literal["implementation", "kernel", "trace", "benchmark", "project"]
# baseline.R: the kernel's baseline's R; impls.R: R of every implementation of the task's kernel
# (of every kernel for a project-scope rule); all.R: R of every implementation of every kernel,
# whatever the rule's scope; kernels.R, traces.R, benchmarks.R: R of every kernel, every trace set,
# every declared benchmark. A bare R: the same implementation's, kernel's, trace set's or benchmark's R,
# else the project's R.
DEP_PREFIXES = ("baseline.", "impls.", "all.", "kernels.", "traces.", "benchmarks.")


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    scope: Scope = "implementation"
    types: list[str] = ["pytorch", "triton", "cuda", "hip"]
    inputs: list[str] = []
    deps: list[str] = []
    # Order only: tasks that must be done before this one starts, whose results it does not read
    # and whose keys are not part of its own (editing one of them does not make this task stale);
    # only those the build runs anyway are waited for.
    after: list[str] = []
    # Gates: among `deps`, those whose result this task reads for its verdict alone (a timing, whether its
    # implementation is correct): in its key as that verdict, so one run again to the same verdict (a shape
    # added to be checked) leaves this task up to date.
    gates: list[str] = []
    devices: list[Literal["cpu", "cuda"]] = ["cpu", "cuda"]
    # Only for the declared units whose flag this names is set (a profiled benchmark's extra nodes, a sweep's
    # summary); not in the key: it decides whether a task exists, not what it computes.
    when: Literal["benchmark.profiler", "benchmark.sweep", "benchmark.use"] | None = None
    config: list[Literal["compile", "correctness", "timing", "profile", "project", "trace", "benchmark"]] = []
    fingerprint: list[
        Literal["python", "torch", "triton", "device", "harness", "nvcc", "hipcc", "ncu", "rocprofv3"]
    ] = []
    action: str
    version: int = 1
    description: str = ""
    source: str = Field("", exclude=True, description="file the rule came from, for messages")

    @property
    def builtin_action(self) -> str | None:
        return self.action[len("magpie:") :] if self.action.startswith("magpie:") else None

    def identity(self) -> dict:
        """What of the rule keys its artifacts."""
        return self.model_dump(exclude={"description", "source", "after", "when"})


def _parse_rules(path: Path, tables: list, field: str) -> list[Rule]:
    rules = []
    for i, table in enumerate(tables):
        try:
            rules.append(Rule.model_validate({**table, "source": str(path)}))
        except ValidationError as err:
            detail = str(describe_validation_error(path, err)).split(": ", 1)[1]
            raise UserError(f"{path}: {field}[{i}].{detail}") from None
    return rules


def builtin_rules() -> list[Rule]:
    rules = []
    for path in sorted(rules_dir().glob("*.toml")):
        rules.extend(_parse_rules(path, parse_toml(path).get("rule", []), "rule"))
    return rules


def resolve_rules(project_rules: list[dict], manifest_path) -> list[Rule]:
    """Built-in rules with the project's overrides and additions applied."""
    rules = builtin_rules()
    for i, table in enumerate(project_rules):
        if not isinstance(table, dict) or "name" not in table:
            raise located(manifest_path, f"rule[{i}].name", "required field is missing")
        targets = [
            j
            for j, rule in enumerate(rules)
            if rule.name == table["name"] and ("types" not in table or set(table["types"]) & set(rule.types))
        ]
        if targets:
            for j in targets:
                base = rules[j].model_dump(exclude={"source"})
                merged = {**base, **table}
                if "types" in table:
                    merged["types"] = sorted(set(table["types"]) & set(rules[j].types))
                rules[j] = _parse_rules(manifest_path, [merged], "rule")[0]
        else:
            rules.extend(_parse_rules(Path(manifest_path), [table], "rule"))
    _check_deps(rules, manifest_path)
    return rules


def _check_deps(rules: list[Rule], manifest_path) -> None:
    names = {rule.name for rule in rules}
    for rule in rules:
        for field in ("deps", "after"):
            for dep in getattr(rule, field):
                bare = dep.split(".", 1)[1] if dep.startswith(DEP_PREFIXES) else dep
                if bare not in names:
                    raise located(
                        rule.source or manifest_path,
                        f"rule {rule.name!r}.{field}",
                        f"no rule named {bare!r} (known: {', '.join(sorted(names))})",
                    )
