"""A worker's memory limit where the manifest sets none (issue 38, requirement 2): sized to the
machine, half its memory shared by the workers a build may run at once (a baseline's and a
candidate's per job, `-j`). On 872a590 it was 8192 MiB whatever the machine: four jobs' workers
on a 24 GiB machine could together hold more than it has."""

import json

from conftest import relu2_report

from magpie import sandbox


def test_a_workers_default_memory_limit_is_a_share_of_the_machine_by_jobs(tmp_path):
    relu2_report(tmp_path, ["raises"], shapes="[[33, 65]]", jobs=2)
    expected = sandbox.default_memory_mb(2)
    assert expected < sandbox.default_memory_mb(1)
    # what each step's result records of the sandbox its workers ran in
    isolations = {
        json.loads(result.read_text()).get("isolation")
        for result in (tmp_path / "workspaces/store").glob("*/*/result.json")
    } - {None}
    assert isolations and all(f"limits: memory {expected} MiB" in line for line in isolations), isolations
