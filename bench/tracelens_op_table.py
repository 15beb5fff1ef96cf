"""Write tests/fixtures/tracelens_ops.json: the ops TraceLens models, read from its own source.

The fixture is TraceLens's op -> perf model table (`op_to_perf_model_class_map` of
`TraceLens/PerfModel/torch_op_mapping.py`, its extensions' pseudo ops included), each op with the
model class's name, its category (`ops_summary`'s "op category") and its sheet (the family CSV),
and the ops it only categorises (`CATEGORY_ONLY_OP_MAPPING`). `tests/test_tracelens_ops.py` fails on
any op in it that magpie does not know, so a TraceLens upgrade cannot add an op silently: run this
on the new checkout and the test names what to add.

Usage, from the repository root (TraceLens's own imports need pandas; torch is not needed):

    git clone https://github.com/AMD-AGI/TraceLens /tmp/TraceLens
    git -C /tmp/TraceLens checkout 171dd74721ca1ec45709e5805b68ae1f65e27811
    python bench/tracelens_op_table.py /tmp/TraceLens
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tracelens_ops.json"
MAPPING_FILE = "TraceLens/PerfModel/torch_op_mapping.py"


def table(checkout: Path) -> dict:
    commit = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    sys.path.insert(0, str(checkout))
    import TraceLens.PerfModel.torch_op_mapping as mapping  # noqa: PLC0415 (from the checkout given)

    models = {
        op: {
            "model": cls.__name__,
            "category": mapping.get_perf_model_category(cls),
            "sheet": mapping.get_perf_model_sheet_category(cls),
        }
        for op, cls in sorted(mapping.op_to_perf_model_class_map.items())
    }
    return {
        "source": {
            "repository": "https://github.com/AMD-AGI/TraceLens",
            "commit": commit,
            "file": MAPPING_FILE,
            "written_by": "bench/tracelens_op_table.py",
        },
        "models": models,
        "category_only": dict(sorted(mapping.CATEGORY_ONLY_OP_MAPPING.items())),
        "name_patterns": [[pattern.pattern, category] for pattern, category in mapping.OP_CATEGORY_PATTERNS],
    }


def main() -> int:
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / MAPPING_FILE).is_file():
        print(
            f"usage: python bench/tracelens_op_table.py TRACELENS_CHECKOUT (a clone holding {MAPPING_FILE})",
            file=sys.stderr,
        )
        return 2
    data = table(Path(sys.argv[1]).resolve())
    FIXTURE.write_text(json.dumps(data, indent=1) + "\n")
    print(
        f"{FIXTURE}: {len(data['models'])} modelled ops, {len(data['category_only'])} categorised only, "
        f"TraceLens {data['source']['commit'][:12]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
