"""The method registry: every list of method names derives from it, and a method is one declaration
(`serial+library`: the per-failure schedule with the library's candidate policy)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import Roles, add_answer, make_ws
from typer.testing import CliRunner

from ecdysis.cli.main import app
from ecdysis.compare.results import TRAINED
from ecdysis.compare.run import ARMS, TrainerArm, arm_class, build_arms
from ecdysis.models import ScriptedModel
from ecdysis.trainer import records, train_async
from ecdysis.trainer.candidates import LIBRARY, PUBLISHED
from ecdysis.trainer.methods import METHODS, Method, register, trained_methods, trainer_methods
from ecdysis.trainer.proposers import SerialProposer
from ecdysis.trainer.records import SpecRecord
from ecdysis.trainer.schedules import PerFailureSchedule
from ecdysis.trainer.targets import target_order


def test_every_list_of_names_derives_from_the_registry() -> None:
    assert ARMS == tuple(METHODS)
    assert trainer_methods() == ("serial", "serial+library", "aggregate", "ecdysis")
    assert TRAINED == trained_methods() == ("serial", "serial+library", "aggregate", "ecdysis", "gepa")
    assert all(arm_class(n) is TrainerArm for n in trainer_methods())
    # a method matched to another's spend runs after it
    assert list(ARMS).index("best-of-k") > list(ARMS).index(METHODS["best-of-k"].spend_of or "")
    train_help = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "400"}).output
    compare_help = CliRunner().invoke(app, ["compare", "--help"], env={"COLUMNS": "400"}).output
    assert all(n in train_help for n in trainer_methods()) and "best-of-k" not in train_help
    assert ",".join(METHODS) in compare_help


def test_a_method_is_one_declaration() -> None:
    try:
        register(Method("serial-again", "a test method", "engine", PerFailureSchedule(), SerialProposer, LIBRARY))
        assert "serial-again" in trainer_methods() and "serial-again" in trained_methods()
        (arm,) = build_arms(make_config(), ["serial-again"])
        assert isinstance(arm, TrainerArm)
        with pytest.raises(ValueError, match="declared twice"):
            register(Method("serial-again", "again", "evaluate"))
        with pytest.raises(ValueError, match="declare that first"):
            register(Method("best-of-2", "later", "sample", spend_of="not-yet"))
        with pytest.raises(ValueError, match="needs a schedule and a proposer"):
            Method("broken", "no schedule", "engine", proposer=SerialProposer)
    finally:
        METHODS.pop("serial-again", None)


def make_config():  # noqa: ANN201 - a Config
    from ecdysis.config import load_config

    return load_config(None, [])


@pytest.mark.parametrize("arm", ["serial", "serial+library"])
async def test_serial_with_the_library_takes_a_measured_lever_without_a_role_call(tmp_path: Path, arm: str) -> None:
    """The seed misses the boxed format on every task; the boxed_answer repair, measured on the stored replies,
    fixes the target failure. serial+library takes it with no role call; serial as published asks the roles."""
    assert METHODS["serial+library"].candidates == LIBRARY and METHODS["serial"].candidates == PUBLISHED
    roles = Roles()
    ws = make_ws(tmp_path, roles, ScriptedModel(add_answer, name="adder"), "train.rounds=1",
                 "train.serial_max_edits=1", "train.engine.skip_debate_when_verified=true")
    result = await train_async(ws.config, arm, ws=ws)
    (first,) = result.rounds[0].edits
    failing = [t.id for t in ws.tasks("train", ws.config.train.train_limit)]  # the seed fails every one
    assert first.task == target_order(failing, ws.config.run.seed, "r1")[0] and first.accepted  # seeded order
    source = records.load(ws.store, result.run_id, SpecRecord, "r1/f0").source
    if arm == "serial+library":
        assert roles.calls == [] and result.optimizer_calls == 0
        assert source.startswith("library: enable_repair boxed_answer")
    else:
        assert roles.calls == ["SINGLE"] and source == "roles"


async def test_serial_with_the_library_is_a_compare_arm(tmp_path: Path) -> None:
    from ecdysis.compare.run import compare

    roles = Roles()
    ws = make_ws(tmp_path, roles, ScriptedModel(add_answer, name="adder"), "train.rounds=1",
                 "train.serial_max_edits=1")
    (result,) = await compare(ws.config, ["serial+library"], open_workspace=lambda cfg: ws)
    assert result.arm == "serial+library" and result.accepted_edits == 1 and result.test_acc == 1.0
    assert roles.calls == []
