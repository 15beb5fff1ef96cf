"""What a build stores and publishes names the project's files relative to its root (issue
37.9): the same project built at two paths writes results, comparisons, reports and `build
--json` that never carry the building machine's path, and its trace analysis reads the same."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, build_json, copy_fixtures, kernel_table, project_toml

from magpie.execution.relative_paths import ProjectPaths

# a trace the analysis warns about by its path (no steps), and a file it skips by its path
TRACES = ("conv_bf16.json.gz", "capture_info.json")


def build_at(root: Path) -> dict:
    copy_fixtures(root, ["good", "spec", "raises"])
    (root / "traces").mkdir()
    for name in TRACES:
        shutil.copy(FIXTURES / "traces/h200" / name, root / "traces" / name)
    kernel = kernel_table(
        "relu2", "good", ["raises"], shapes="[[8, 16]]", settings="trials = 1", timing="warmup_ms = 1\nbudget_ms = 10"
    )
    traces = '[[traces]]\nid = "captures"\ndir = "traces"\nanalysis_mode = "inference"\n'
    (root / "magpie.toml").write_text(project_toml(kernel, traces))
    summary = build_json(root)
    assert summary["failed"] == []
    return summary


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory) -> list[tuple[Path, dict]]:
    roots = [tmp_path_factory.mktemp("first") / "project", tmp_path_factory.mktemp("second") / "elsewhere"]
    for root in roots:
        root.mkdir()
    return [(root, build_at(root)) for root in roots]


def written(root: Path) -> dict[str, str]:
    """Every text file a build stored or published, by its path under the workspace."""
    workspace = root / "workspaces"
    return {
        path.relative_to(workspace).as_posix(): path.read_text()
        for folder in (workspace / "store", workspace / "reports")
        for path in folder.rglob("*")
        if path.is_file() and path.suffix in (".json", ".md", ".html", ".csv")
    }


def test_no_result_report_or_summary_carries_the_project_path(two_builds):
    for root, summary in two_builds:
        files = written(root)
        assert any(name.endswith("compare_report.json") for name in files)
        assert any(name.endswith("summary.md") for name in files)
        carrying = [name for name, text in files.items() if str(root) in text]
        assert carrying == [], f"{root} in {carrying}"
        assert str(root) not in json.dumps(summary)


def test_the_trace_analysis_names_its_traces_relative_to_the_project_at_either_path(two_builds):
    analyses = [
        json.loads((root / "workspaces/reports/traces/captures/result.json").read_text())["summary"]
        for root, _ in two_builds
    ]
    assert [trace["path"] for trace in analyses[0]["traces"]] == ["traces/conv_bf16.json.gz"]
    assert any(line.startswith("skipped traces/capture_info.json") for line in analyses[0]["warnings"])
    assert analyses[0] == analyses[1]


def test_only_the_root_where_it_starts_a_path_is_rewritten():
    paths = ProjectPaths("/work/proj")
    assert paths.text("/work/proj/k/a.py: line 3") == "k/a.py: line 3"
    assert paths.text("in /work/proj, then") == "in ., then"
    assert paths.text("/work/project2/a.py and /work/proj2") == "/work/project2/a.py and /work/proj2"
    assert paths.value({"/work/proj/x": ["/work/proj/y", 1]}) == {"x": ["y", 1]}
    binary = b"\xff/work/proj/a"
    assert paths.files({"a.json": binary, "lib.so": b"/work/proj/a"}) == {"a.json": binary, "lib.so": b"/work/proj/a"}
