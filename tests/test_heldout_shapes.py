"""Held-out shapes (`harness/held_out.py`): besides the declared shapes, a spec's cases are checked
on shapes drawn per build from its secret seed; an implementation correct only on the declared
ones is not credited, and the report says so apart. The drawing and what a spec cannot make are
checked on the real spec loader in this process; the verdicts by one build."""

import json
import random

import pytest
from conftest import FIXTURES, build_json, kernel_table, project_toml, write

from magpie.harness import wire
from magpie.harness.held_out import TILE, drawn_shapes, drawn_size, held_out_cases, problem_sizes
from magpie.harness.spec import ReferenceSpec

TILES = """
import torch

TILE = 32


def kernel(x):
    # whole tiles of a row only: no mask for a last, partial one (256 and 96 are whole tiles)
    out = torch.empty_like(x)
    cols = x.shape[-1] - x.shape[-1] % TILE
    out[..., :cols] = torch.relu(x[..., :cols]) * 2.0
    return out
"""

RESHAPES = """
import torch


ROWS = {256: 64, 96: 4}  # the declared shapes written into the code


def kernel(x):
    return torch.relu(x.view(ROWS[x.shape[-1]], x.shape[-1])) * 2.0
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("held_out")
    write(root, {"tiles.py": TILES, "reshapes.py": RESHAPES})
    (root / "good.py").write_text((FIXTURES / "adversarial/good.py").read_text())
    (root / "spec.py").write_text((FIXTURES / "adversarial/spec.py").read_text())
    kernels = [
        kernel_table("relu2", "good", ["tiles", "reshapes"], shapes="[[64, 256], [4, 96]]", settings="trials = 2"),
        kernel_table("shown", "good", ["tiles"], shapes="[[64, 256]]", settings="held_out_shapes = 0"),
    ]
    (root / "magpie.toml").write_text(project_toml(*kernels, timing="warmup_ms = 2\nbudget_ms = 20\nrounds = 2"))
    assert build_json(root, "-j", "2")["failed"] == []
    rows = {}
    for kernel_id in ("relu2", "shown"):
        found = json.loads((root / f"workspaces/reports/{kernel_id}/compare_report.json").read_text())
        rows.update({f"{kernel_id}/{row['implementation']}": row for row in found["results"]})
    return rows


def test_an_honest_kernel_is_correct_on_the_held_out_shapes_too_and_they_are_reported_apart(report):
    row = report["relu2/good"]
    assert (row["correctness_state"], row["verdict"]) == ("SUCCESS", "correct")
    shapes = row["held_out"]["shapes"]
    # one drawn around [64, 256]; [4, 96] has a dimension to vary too, its 4 kept
    assert len(shapes) == 2 and all(s.endswith(" float32") for s in shapes), shapes
    rows, cols = (int(d) for d in shapes[0].split()[0].split("×"))
    assert 32 <= rows <= 80 and 128 <= cols <= 320 and rows % TILE and cols % TILE
    assert shapes[1].startswith("4×")


def test_a_kernel_correct_only_on_the_declared_shapes_is_not_credited(report):
    row = report["relu2/tiles"]
    shape = report["relu2/good"]["held_out"]["shapes"][0]  # every implementation of a build gets the same
    assert row["correctness_state"] == "FAILED" and row["performance_state"] == "SKIPPED"
    assert row["verdict"].startswith(f"incorrect: passes declared shapes, fails held-out {shape}: finite: "), row[
        "verdict"
    ]
    assert row["held_out"]["shapes"] == report["relu2/good"]["held_out"]["shapes"]


def test_a_kernel_that_raises_on_a_held_out_shape_names_it(report):
    row = report["relu2/reshapes"]
    shape = report["relu2/good"]["held_out"]["shapes"][0]
    assert row["verdict"].startswith(f"incorrect: passes declared shapes, fails held-out {shape}: error: "), row[
        "verdict"
    ]
    assert row["failures"][0]["kind"] == "error" and row["failures"][0]["case"] == f"held-out {shape}"


def test_held_out_shapes_off_leave_the_declared_shapes_alone_to_judge(report):
    row = report["shown/tiles"]
    assert (row["correctness_state"], row["verdict"]) == ("SUCCESS", "correct")
    assert row["held_out"] == {"shapes": [], "notes": []}


def test_drawn_sizes_are_around_the_declared_neither_powers_of_two_nor_multiples_of_16():
    rng = random.Random(7)
    for size in (8, 9, 15, 16, 64, 100, 1000, 1024, 4096, 65536):
        for _ in range(200):
            drawn = drawn_size(rng, size)
            assert (size + 1) // 2 <= drawn <= size + size // 4 and drawn != size
            assert drawn % TILE and drawn & (drawn - 1), (size, drawn)
    assert [drawn_size(rng, size) for size in (1, 3, 4, 7)] == [1, 3, 4, 7]


def test_each_seed_draws_its_own_shapes_of_the_declared_rank():
    declared = [[64, 1024], [2, 8, 512]]
    first, again, other = (drawn_shapes(declared, seed, 1) for seed in (1, 1, 2))
    assert first == again and first != other
    assert [len(s) for s in first] == [2, 3] and first[1][0] == 2
    assert drawn_shapes([[4, 4]], 1, 3) == []  # nothing of 8 or more to vary


def spec_file(tmp_path, text: str) -> ReferenceSpec:
    path = tmp_path / "spec.py"
    path.write_text(text)
    return ReferenceSpec(path, wire.Testcase(), "cpu")


def tc_of_one_shape(**fields) -> wire.Testcase:
    return wire.Testcase(**{"shapes": [[64, 256]], "dtypes": ["float32"], "held_out_shapes": 1, **fields})


def test_a_spec_that_makes_fixed_shapes_has_none_held_out_and_says_so(tmp_path):
    spec = spec_file(
        tmp_path,
        "import torch\n\ndef make_inputs(shape, dtype):\n    return (torch.randn(64, 256),)\n\n"
        "def reference(x):\n    return x\n",
    )
    cases, notes = held_out_cases(spec, 5, "k", 0, tc_of_one_shape(), 0)
    assert cases == [] and notes == ["spec.py: makes the declared shapes whatever it is asked: no held-out shapes"]


def test_a_shape_the_spec_cannot_make_is_skipped_with_a_note(tmp_path):
    spec = spec_file(
        tmp_path,
        "import torch\n\ndef make_inputs(shape, dtype):\n    assert shape[1] == 256, 'rows of 256 only'\n"
        "    return (torch.randn(*shape),)\n\ndef reference(x):\n    return x\n",
    )
    cases, notes = held_out_cases(spec, 5, "k", 0, tc_of_one_shape(), 0)
    assert cases == [] and len(notes) == 1
    assert (
        notes[0].startswith("held-out ")
        and "skipped: the spec cannot make it" in notes[0]
        and "rows of 256" in notes[0]
    )


def test_a_kernelbench_problems_sizes_are_the_constants_only_its_inputs_read(tmp_path):
    spec = spec_file(
        tmp_path,
        "import torch\nimport torch.nn as nn\n\nbatch_size = 16\nfeatures = 64\nscale = 2\n\n"
        "class Model(nn.Module):\n    def __init__(self, features):\n        super().__init__()\n"
        "        self.linear = nn.Linear(features, features)\n\n    def forward(self, x):\n"
        "        return self.linear(x) * scale\n\n"
        "def get_inputs():\n    return [torch.randn(batch_size, features) * scale]\n\n"
        "def get_init_inputs():\n    return [features]\n",
    )
    # features makes the model, scale is read by its forward: only batch_size may vary
    assert problem_sizes(spec.module) == {"batch_size": 16}
    cases, notes = held_out_cases(spec, 5, "k", 0, tc_of_one_shape(), 0)
    assert notes == [] and len(cases) == 1 and cases[0].sizes["batch_size"] != 16
    assert cases[0].label == f"held-out {cases[0].sizes['batch_size']}×64"
    assert spec.module.batch_size == 16  # put back after its inputs were made


def test_a_kernelbench_problem_of_fixed_shapes_says_so(tmp_path):
    spec = spec_file(
        tmp_path,
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return x\n\ndef get_inputs():\n    return [torch.randn(16, 64)]\n",
    )
    cases, notes = held_out_cases(spec, 5, "k", 0, tc_of_one_shape(), 0)
    assert cases == [] and "its inputs' shapes are fixed, no held-out shapes" in notes[0]
