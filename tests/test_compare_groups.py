"""Test accuracy by task group (`compare-summary --groups`): the group file, the numbers, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ecdysis.compare.groups import UNGROUPED, group_report, read_groups
from ecdysis.compare.results import ArmResult

GROUPS = {"a": "units", "b": "units", "c": "labels", "d": "labels"}


def results() -> list[ArmResult]:
    """Two seeds: `fixed` fails every units task; `aggregate` fixes units on both seeds, breaks one label task."""
    fixed = [ArmResult("fixed", s, test_per_task={"a": 0.0, "b": 0.0, "c": 1.0, "d": 1.0, "e": 0.0}) for s in (0, 1)]
    agg = [ArmResult("aggregate", 0, test_per_task={"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0, "e": 0.0}),
           ArmResult("aggregate", 1, test_per_task={"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 1.0})]
    return fixed + agg


def test_accuracy_and_paired_difference_per_group_on_known_inputs() -> None:
    report = group_report(results(), GROUPS, reps=500)
    names, cells = report.groups, report.cells
    assert names == ["labels", "units", UNGROUPED] and report.reference == "fixed"  # fixed ran; ungrouped last
    units, labels, other = (cells["aggregate"][g] for g in ("units", "labels", UNGROUPED))
    assert (units.accuracy, units.n) == (1.0, 4) and cells["fixed"]["units"].accuracy == 0.0
    assert units.difference is not None and units.difference.value == 1.0
    assert (units.difference.low, units.difference.high) == (1.0, 1.0)  # every pair +1: no spread
    assert labels.accuracy == 0.75 and labels.difference is not None and labels.difference.value == -0.25
    assert labels.difference.low is not None and labels.difference.low < -0.25 < 0.0 <= labels.difference.high
    assert other.n == 2 and other.difference is not None and other.difference.value == 0.5
    assert cells["fixed"]["units"].difference is None  # the reference has no difference to itself
    without = group_report([r for r in results() if r.arm != "fixed"], GROUPS)  # no fixed arm: accuracies only
    assert without.reference is None and without.cells["aggregate"]["units"].difference is None
    assert without.cells["aggregate"]["units"].accuracy == 1.0
    with pytest.raises(ValueError, match="--reference 'serial' has no test scores here; arms: fixed, aggregate"):
        group_report(results(), GROUPS, reference="serial")
    with pytest.raises(ValueError, match="none of the 5 test tasks is in the group file"):
        group_report(results(), {"x1": "units"})


def test_a_difference_over_fewer_pairs_than_its_accuracy_names_its_n() -> None:
    """The reference lacks seed 1: the arm's accuracy pools both seeds (n=4), its difference pairs seed 0 only."""
    from rich.console import Console

    partial = [r for r in results() if not (r.arm == "fixed" and r.seed == 1)]
    report = group_report(partial, GROUPS, reps=200)
    units = report.cells["aggregate"]["units"]
    assert units.n == 4 and units.difference is not None and units.difference.n == 2
    console = Console(width=200, record=True)
    console.print(report.table())
    text = console.export_text()
    assert "1.000 (n=4)" in text and "+1.000 [+1.000, +1.000] (n=2)" in text


def test_a_group_file_is_json_or_two_column_csv_and_a_bad_one_is_named(tmp_path: Path) -> None:
    (tmp_path / "g.json").write_text(json.dumps(GROUPS))
    assert read_groups(tmp_path / "g.json") == GROUPS
    (tmp_path / "g.csv").write_text("task_id,group\na,units\nb , units\n\nc,labels\n")
    assert read_groups(tmp_path / "g.csv") == {"a": "units", "b": "units", "c": "labels"}
    (tmp_path / "g.tsv").write_text("a\tunits\nc\tlabels\n")
    (tmp_path / "excel.CSV").write_text("\ufefftask_id,group\na,units\n")  # a spreadsheet's BOM and header
    assert read_groups(tmp_path / "excel.CSV") == {"a": "units"}
    (tmp_path / "twice.csv").write_text("a,units\na,labels\n")
    with pytest.raises(ValueError, match=r"twice\.csv, line 2: task 'a' is already in group 'units'"):
        read_groups(tmp_path / "twice.csv")
    assert read_groups(tmp_path / "g.tsv") == {"a": "units", "c": "labels"}
    (tmp_path / "bad.csv").write_text("a,units\nb,units,extra\n")
    with pytest.raises(ValueError, match=r"bad\.csv, line 2: expected two columns"):
        read_groups(tmp_path / "bad.csv")
    (tmp_path / "bad.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match=r"bad\.json: expected a JSON object of task id -> group"):
        read_groups(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text('{"a": ')
    with pytest.raises(ValueError, match=r"broken\.json: not JSON"):
        read_groups(tmp_path / "broken.json")
    with pytest.raises(ValueError, match="cannot read the group file"):
        read_groups(tmp_path / "missing.json")


def test_compare_summary_prints_and_writes_the_group_table(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ecdysis.cli.main import app
    from ecdysis.compare.files import write_results

    write_results(results(), tmp_path / "cmp")
    (tmp_path / "g.json").write_text(json.dumps(GROUPS))
    out = CliRunner().invoke(app, ["compare-summary", str(tmp_path / "cmp"), "--groups", str(tmp_path / "g.json"),
                                   "--out", str(tmp_path / "pooled")], terminal_width=250)
    assert out.exit_code == 0, out.output
    assert "paired difference vs fixed, 95% CI" in out.output and "1.000 (n=4)" in out.output
    saved = json.loads((tmp_path / "pooled" / "groups.json").read_text())
    assert saved["reference"] == "fixed" and saved["arms"]["aggregate"]["units"]["difference"]["value"] == 1.0
    (tmp_path / "bad.csv").write_text("a\n")
    out = CliRunner().invoke(app, ["compare-summary", str(tmp_path / "cmp"), "--groups", str(tmp_path / "bad.csv")])
    assert out.exit_code != 0 and "expected two columns" in out.output
