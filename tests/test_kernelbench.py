"""KernelBench problems as kernels (`kernelbench = "problem.py"`): level-1 style problems written
here (ReLU, matmul, softmax, and a two-layer MLP whose weights matter), each with an honest
ModelNew, a wrong one and one correct only on the problem's own shapes. One build of the project
serves the scenarios; the held-out shapes' own rules are tests/test_heldout_shapes.py's."""

import json

import pytest
from conftest import build_json, magpie_in_process, write

PROBLEMS = {
    "problems/relu.py": """
        import torch
        import torch.nn as nn

        batch_size = 16
        dim = 256


        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return torch.relu(x)


        def get_inputs():
            return [torch.randn(batch_size, dim)]


        def get_init_inputs():
            return []
        """,
    "problems/matmul.py": """
        import torch
        import torch.nn as nn

        M = 64
        K = 128
        N = 32


        class Model(nn.Module):
            def forward(self, A, B):
                return torch.matmul(A, B)


        def get_inputs():
            return [torch.randn(M, K), torch.randn(K, N)]


        def get_init_inputs():
            return []
        """,
    "problems/softmax.py": """
        import torch
        import torch.nn as nn

        batch_size = 8
        dim = 512


        class Model(nn.Module):
            def forward(self, x):
                return torch.softmax(x, dim=1)


        def get_inputs():
            return [torch.randn(batch_size, dim)]


        def get_init_inputs():
            return []
        """,
    "problems/mlp.py": """
        import torch
        import torch.nn as nn

        batch_size = 32
        features = 64
        hidden = 96


        class Model(nn.Module):
            def __init__(self, features, hidden):
                super().__init__()
                self.up = nn.Linear(features, hidden)
                self.down = nn.Linear(hidden, features)

            def forward(self, x):
                return self.down(torch.relu(self.up(x)))


        def get_inputs():
            return [torch.randn(batch_size, features)]


        def get_init_inputs():
            return [features, hidden]
        """,
}

CANDIDATES = {
    "relu/honest.py": """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.clamp_min(x, 0.0)
        """,
    "relu/wrong.py": """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.nn.functional.leaky_relu(x, 0.01)
        """,
    # whole tiles of a row only: no mask for a last, partial tile (256 is a multiple of 64)
    "relu/tiles.py": """
        import torch
        import torch.nn as nn

        TILE = 64


        class ModelNew(nn.Module):
            def forward(self, x):
                out = torch.empty_like(x)
                cols = x.shape[-1] - x.shape[-1] % TILE
                out[..., :cols] = torch.clamp_min(x[..., :cols], 0.0)
                return out
        """,
    "matmul/honest.py": """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, A, B):
                return torch.mm(A, B)
        """,
    "matmul/wrong.py": """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, A, B):
                return torch.mm(A, B).t().contiguous().t() + 1e-3
        """,
    # blocks of 32 along each of M, N and K, none for a remainder (64, 128 and 32 are whole blocks)
    "matmul/blocks.py": """
        import torch
        import torch.nn as nn

        BLOCK = 32


        class ModelNew(nn.Module):
            def forward(self, A, B):
                m, k = (size - size % BLOCK for size in A.shape)
                n = B.shape[1] - B.shape[1] % BLOCK
                out = torch.zeros(A.shape[0], B.shape[1], dtype=A.dtype, device=A.device)
                out[:m, :n] = A[:m, :k] @ B[:k, :n]
                return out
        """,
    "softmax/honest.py": """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, x):
                shifted = x - x.amax(dim=1, keepdim=True)
                e = shifted.exp()
                return e / e.sum(dim=1, keepdim=True)
        """,
    "softmax/wrong.py": """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.softmax(x, dim=0)
        """,
    # the row length written into the code: any other fails
    "softmax/fixed_rows.py": """
        import torch
        import torch.nn as nn

        ROW = 512


        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.softmax(x.reshape(-1, ROW), dim=1).reshape(x.shape)
        """,
    # its layers made in the other order: seeded construction alone would give it other weights
    "mlp/honest.py": """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def __init__(self, features, hidden):
                super().__init__()
                self.down = nn.Linear(hidden, features)
                self.up = nn.Linear(features, hidden)

            def forward(self, x):
                hidden = torch.clamp_min(torch.addmm(self.up.bias, x, self.up.weight.t()), 0.0)
                return torch.addmm(self.down.bias, hidden, self.down.weight.t())
        """,
    "mlp/wrong.py": """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def __init__(self, features, hidden):
                super().__init__()
                self.up = nn.Linear(features, hidden)
                self.down = nn.Linear(hidden, features)

            def forward(self, x):
                return self.down(torch.nn.functional.gelu(self.up(x)))
        """,
}


def kernel(kernel_id: str, problem: str, baseline: str, candidates: list[str], extra: str = "") -> str:
    table = (
        f'[[kernel]]\nid = "{kernel_id}"\ntype = "pytorch"\nkernelbench = "problems/{problem}.py"\n{extra}\n'
        f'[kernel.baseline]\nid = "{baseline}"\nsource = "{problem}/{baseline}.py"\n'
    )
    return table + "".join(
        f'[[kernel.candidates]]\nid = "{name}"\nsource = "{problem}/{name}.py"\n' for name in candidates
    )


MANIFEST = "\n".join(
    [
        '[project]\nname = "kb"\n\n[defaults.timing]\nwarmup_ms = 2\nbudget_ms = 20\nrounds = 2\n',
        kernel("relu", "relu", "honest", ["wrong", "tiles"]),
        kernel("matmul", "matmul", "honest", ["wrong", "blocks"]),
        kernel("softmax", "softmax", "honest", ["wrong", "fixed_rows"]),
        kernel("mlp", "mlp", "honest", ["wrong"]),
        # the same tiled ReLU with held-out shapes turned off: credited, as on the problem's shapes it is right
        kernel("relu_shown", "relu", "honest", ["tiles"], extra="held_out_shapes = 0"),
    ]
)


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict[str, dict]]:
    root = tmp_path_factory.mktemp("kernelbench")
    write(root, {**PROBLEMS, **CANDIDATES, "magpie.toml": MANIFEST})
    assert build_json(root, "-j", "2")["failed"] == []
    out = {}
    for kernel_id in ("relu", "matmul", "softmax", "mlp", "relu_shown"):
        report = json.loads((root / f"workspaces/reports/{kernel_id}/compare_report.json").read_text())
        out[kernel_id] = {row["implementation"]: row for row in report["results"]}
    return out


@pytest.mark.parametrize("kernel_id", ["relu", "matmul", "softmax", "mlp"])
def test_an_honest_model_new_is_correct_on_declared_and_held_out_shapes(reports, kernel_id):
    row = reports[kernel_id]["honest"]
    assert (row["correctness_state"], row["verdict"]) == ("SUCCESS", "correct")
    assert row["held_out"]["shapes"], row["held_out"]  # checked on shapes besides the problem's own
    assert row["performance_state"] == "SUCCESS"


@pytest.mark.parametrize("kernel_id", ["relu", "matmul", "softmax", "mlp"])
def test_a_wrong_model_new_fails_on_the_problems_own_shapes(reports, kernel_id):
    row = reports[kernel_id]["wrong"]
    assert row["correctness_state"] == "FAILED"
    assert row["verdict"].startswith("incorrect: allclose on kernelbench"), row["verdict"]


@pytest.mark.parametrize(
    ("kernel_id", "candidate"), [("relu", "tiles"), ("matmul", "blocks"), ("softmax", "fixed_rows")]
)
def test_a_model_new_correct_only_on_the_problems_shapes_is_not_credited(reports, kernel_id, candidate):
    row = reports[kernel_id][candidate]
    assert row["correctness_state"] == "FAILED" and row["performance_state"] == "SKIPPED"
    shape = reports[kernel_id]["honest"]["held_out"]["shapes"][0]
    assert row["verdict"].startswith(f"incorrect: passes declared shapes, fails held-out {shape}: "), row["verdict"]


def test_with_held_out_shapes_off_the_problems_shapes_alone_judge(reports):
    row = reports["relu_shown"]["tiles"]
    assert (row["correctness_state"], row["verdict"]) == ("SUCCESS", "correct")
    assert row["held_out"] == {"shapes": [], "notes": []}


def test_a_model_new_whose_layers_draw_their_weights_in_another_order_holds_the_models(reports):
    # the weights reach ModelNew as the reference Model's state: the order it makes them in is its own
    assert reports["mlp"]["honest"]["correctness_state"] == "SUCCESS"


@pytest.mark.parametrize(
    ("problem", "text", "error"),
    [
        (None, "", "kernel[0].kernelbench: file not found: problems/missing.py"),
        (
            "problems/missing.py",
            "import torch\n\ndef reference(x):\n    return x\n",
            "kernel[0].kernelbench: problems/missing.py is not a KernelBench problem: it must define class Model",
        ),
    ],
)
def test_a_kernelbench_field_that_names_no_problem_is_one_line(tmp_path, problem, text, error):
    files = {"magpie.toml": kernel("k", "missing", "honest", []), "missing/honest.py": CANDIDATES["relu/honest.py"]}
    if problem:
        files[problem] = text
    write(tmp_path, files)
    proc = magpie_in_process("build", cwd=tmp_path, check=2)
    assert error in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.gpu
def test_kernelbench_problems_are_judged_on_the_gpu_with_held_out_shapes(tmp_path):
    """The same problems on the project's GPU: Model's state loaded into ModelNew there, the held-out
    shapes made on the device."""
    manifest = MANIFEST.replace('name = "kb"', 'name = "kb"\ndevice = "cuda"')
    write(tmp_path, {**PROBLEMS, **CANDIDATES, "magpie.toml": manifest})
    assert build_json(tmp_path, "-j", "2")["failed"] == []
    for kernel_id, cheat in (("relu", "tiles"), ("matmul", "blocks"), ("softmax", "fixed_rows"), ("mlp", None)):
        report = json.loads((tmp_path / f"workspaces/reports/{kernel_id}/compare_report.json").read_text())
        rows = {row["implementation"]: row for row in report["results"]}
        assert rows["honest"]["correctness_state"] == "SUCCESS", rows["honest"]["verdict"]
        assert rows["honest"]["held_out"]["shapes"]
        assert rows["wrong"]["correctness_state"] == "FAILED"
        if cheat:
            assert "passes declared shapes, fails held-out" in rows[cheat]["verdict"], rows[cheat]["verdict"]
