"""The loop's MCP tools (issue 43, point 6): loop_status, kernel_from_trace and get_ab_report, each on a real stdio
server (`magpie mcp`), its structured result checked against the output schema it lists, as tests/test_mcp.py does."""

from __future__ import annotations

import shutil
from pathlib import Path

import jsonschema
import pytest
from loop_fixtures import loop_project
from test_mcp import Session, output_schema, stdio_server

DECODE = "llama_decode_bf16.json.gz"
LOOP_TOOLS = ("loop_status", "kernel_from_trace", "get_ab_report")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    base = tmp_path_factory.mktemp("loop_mcp")
    (base / "model").mkdir()
    (base / "model" / "config.json").write_text("{}")  # an input of the benchmark here, never served
    root = loop_project(base / "proj", base / "model", {"good": '{ rmsnorm = "best" }'})
    (root / "traces").mkdir()
    shutil.copy(Path(__file__).parent / "fixtures" / "traces" / "h200" / DECODE, root / "traces" / DECODE)
    return root


@pytest.fixture(scope="module")
def server(project):
    session: Session = stdio_server(project)
    yield session
    session.close()


def test_the_loop_tools_are_listed_with_object_schemas(server):
    tools = {tool.name: tool for tool in server.list_tools().tools}
    for name in LOOP_TOOLS:
        assert tools[name].output_schema["type"] == "object", name
        assert tools[name].description, name
    assert tools["loop_status"].annotations.read_only_hint
    assert not tools["kernel_from_trace"].annotations.read_only_hint


def test_loop_status_answers_the_next_step_in_its_schema(server):
    status = server.ok("loop_status")
    jsonschema.validate(status, output_schema(server, "loop_status"))
    assert status["benchmark"] == "good"
    assert status["next_step"]["command"] == "magpie build benchmark:good"
    assert "no [[benchmark]] 'nope'" in server.error("loop_status", {"benchmark": "nope"})


def test_kernel_from_trace_writes_the_spec_and_gives_the_kernel_table(server, project):
    made = server.ok("kernel_from_trace", {"trace": f"traces/{DECODE}", "op": "aten::mm", "top": 2})
    jsonschema.validate(made, output_schema(server, "kernel_from_trace"))
    assert made["files"] == ["kernels/aten_mm/spec.py", "kernels/aten_mm/baseline.py"]
    assert all((project / f).is_file() for f in made["files"])
    assert (
        made["kernel_toml"].startswith("[[kernel]]") and 'source = "kernels/aten_mm/baseline.py"' in made["kernel_toml"]
    )
    assert len(made["signatures"]) == 2 and made["signatures"][0]["share"] >= made["signatures"][1]["share"]
    assert "outside the project root" in server.error(
        "kernel_from_trace", {"trace": f"traces/{DECODE}", "op": "aten::mm", "folder": "../elsewhere"}
    )


def test_get_ab_report_before_the_ab_is_built_says_how_to_build_it(server):
    assert "benchmark_ab:good: not built yet" in server.error("get_ab_report", {})
