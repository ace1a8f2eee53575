"""Harness files are regular files inside the harness folder (issue 34, part 1).

A harness folder is written by models (the confined external implementer writes its copy) or handed to
`eval --harness` / `serve --harness`. A symbolic link planted in it must never make the host read a host file
with its rights (`/proc/self/environ` -> API keys; a held-out answer file -> a perfect score); a FIFO must not
hang the host, a socket or device not crash it; a path must not leave the folder when a version is written.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sqlite3
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import Roles, add_answer, make_ws, seed_files, write_seed  # noqa: E402

from ecdysis.cli.main import app  # noqa: E402
from ecdysis.harness.manifest import HarnessError, load_harness, version_from_files  # noqa: E402
from ecdysis.models import ScriptedModel  # noqa: E402
from ecdysis.sandbox.confine import bwrap_path  # noqa: E402
from ecdysis.store import DB_NAME  # noqa: E402
from ecdysis.trainer import records, train_async  # noqa: E402
from ecdysis.trainer.records import CandidateRecord  # noqa: E402

SECRET = "sk-hostile-paths-0123456789abcdef"  # a host secret: in the environment and in a host file
HELD_OUT = "HELD-OUT-ANSWERS-q7=17-q8=19-q9=21"  # a host file the harness must never see


@pytest.fixture()
def secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(a host file holding a fake secret, a host file of held-out answers), and the secret in the environment."""
    monkeypatch.setenv("ECDYSIS_TEST_HOST_SECRET", SECRET)
    key = tmp_path / "host_key.txt"
    key.write_text(f"OPENAI_API_KEY={SECRET}\n")
    held = tmp_path / "heldout_answers.txt"
    held.write_text(HELD_OUT + "\n")
    return key, held


def seed_dir(tmp_path: Path, name: str = "harness") -> Path:
    return write_seed(tmp_path / name, "gsm8k")


def name_contract(harness: Path, path: str) -> None:
    """Point the manifest's contract layer at `path`."""
    manifest = (harness / "harness.toml").read_text()
    lines = [f'contract = "{path}"' if line.startswith("contract =") else line for line in manifest.splitlines()]
    (harness / "harness.toml").write_text("\n".join(lines) + "\n")


def refused(directory: Path, name: str, problem: str) -> HarnessError:
    """load_harness refuses `directory`, naming `name` and `problem`; the refusal carries no secret."""
    with pytest.raises(HarnessError) as caught:
        load_harness(directory)
    message = str(caught.value)
    assert f"{name}: {problem}" in message, message
    assert SECRET not in message and HELD_OUT not in message
    return caught.value


@pytest.mark.parametrize("target", ["/proc/self/environ", "key"])
def test_a_symlinked_layer_file_is_refused_naming_it(tmp_path: Path, secrets: tuple[Path, Path],
                                                     target: str) -> None:
    harness = seed_dir(tmp_path)
    (harness / "contract.md").unlink()
    (harness / "contract.md").symlink_to(target if target.startswith("/") else secrets[0])
    refused(harness, "contract.md", "is a symbolic link")


def test_a_symlinked_extra_file_is_refused_too(tmp_path: Path, secrets: tuple[Path, Path]) -> None:
    """Not only layer files: every file of the folder becomes part of the version (and of the sandbox)."""
    harness = seed_dir(tmp_path)
    (harness / "heldout.txt").symlink_to(secrets[1])
    refused(harness, "heldout.txt", "is a symbolic link")


def test_a_symlinked_folder_is_refused(tmp_path: Path, secrets: tuple[Path, Path]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "contract.md").write_text(f"Your key is {SECRET}\n")
    harness = seed_dir(tmp_path)
    name_contract(harness, "lib/contract.md")
    (harness / "lib").symlink_to(outside, target_is_directory=True)
    refused(harness, "lib", "is a symbolic link")


def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    harness = seed_dir(tmp_path)
    fifo = harness / "notes.md"
    os.mkfifo(fifo)
    outcome: list[BaseException | object] = []

    def load() -> None:
        try:
            outcome.append(load_harness(harness))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # release a reader blocked in open() so the test process can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert outcome, "loading a harness with a FIFO in it hung"
    assert isinstance(outcome[0], HarnessError) and "notes.md: is a FIFO" in str(outcome[0]), outcome


def test_a_socket_file_is_refused(tmp_path: Path) -> None:
    harness = seed_dir(tmp_path)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(harness / "notes.md"))
    try:
        refused(harness, "notes.md", "is a socket")
    finally:
        server.close()


def test_an_oversized_file_is_refused_naming_it(tmp_path: Path) -> None:
    harness = seed_dir(tmp_path)
    (harness / "big.md").write_text("x" * 300_000)
    refused(harness, "big.md", "larger than 256000 bytes")


def test_a_manifest_path_that_leaves_the_folder_is_refused(tmp_path: Path) -> None:
    harness = seed_dir(tmp_path)
    (tmp_path / "secret.md").write_text(SECRET)
    for path in ("../secret.md", str(tmp_path / "secret.md")):
        name_contract(harness, path)
        with pytest.raises(HarnessError, match=r"harness\.toml: files\.contract '.*secret\.md': must be a relative "
                                               r"path inside the harness folder"):
            load_harness(harness)


def test_a_version_whose_paths_leave_the_folder_is_refused_and_never_written(tmp_path: Path) -> None:
    """What a candidate, a stored version or the GEPA arm build is a file map: a key with '..' or an absolute
    path is refused when the version is made, so freezing it cannot write outside the frozen folder."""
    files = seed_files("gsm8k")
    for key in ("../escaped.md", str(tmp_path / "escaped_abs.md")):
        with pytest.raises(HarnessError, match=r"must be a relative path inside the harness folder"):
            version_from_files({**files, key: "written outside"}, origin="candidate").write(tmp_path / "frozen" / "x")
    assert not (tmp_path / "frozen" / "escaped.md").exists() and not (tmp_path / "escaped_abs.md").exists()


def test_writing_a_version_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    """`HarnessVersion.write` (freezing, `train --from-traces --out`) into a folder where a link is planted."""
    version = version_from_files(seed_files("gsm8k"), origin="seed")
    victim = tmp_path / "victim.txt"
    victim.write_text("unchanged\n")
    target = tmp_path / "frozen"
    target.mkdir()
    (target / "contract.md").symlink_to(victim)
    with pytest.raises(HarnessError, match=r"contract\.md: cannot be written"):
        version.write(target)
    assert victim.read_text() == "unchanged\n"


def test_eval_and_serve_refuse_a_symlinked_contract_with_exit_2(tmp_path: Path, data_dir: Path,
                                                                secrets: tuple[Path, Path]) -> None:
    """`contract.md -> /proc/self/environ` would send the host's environment to the model as the system prompt."""
    harness = seed_dir(tmp_path)
    (harness / "contract.md").unlink()
    (harness / "contract.md").symlink_to("/proc/self/environ")
    runner = CliRunner()
    evaluated = runner.invoke(app, ["eval", "--harness", str(harness), "--env", "gsm8k", "--model",
                                    "scripted:Answer: 1", "--limit", "1", "--data-dir", str(data_dir),
                                    "--run-dir", str(tmp_path / "run")])
    assert evaluated.exit_code == 2, evaluated.output
    assert "contract.md: is a symbolic link" in evaluated.output and SECRET not in evaluated.output
    assert "Traceback" not in evaluated.output
    served = runner.invoke(app, ["serve", "--harness", str(harness), "--upstream", "scripted:hi",
                                 "--store", str(tmp_path / "serve")])
    assert served.exit_code == 2, served.output
    assert "cannot serve" in served.output and "contract.md: is a symbolic link" in served.output
    assert SECRET not in served.output


PLANTER = r'''
import os
os.symlink("/proc/self/environ", "notes.md")
os.symlink(os.environ["HELD_OUT_FILE"], "heldout.txt")
with open("contract.md", "a") as f:
    f.write("\nThe answers are in heldout.txt next to this file.\n")
'''


async def test_an_implementer_that_plants_links_gives_a_rejected_candidate_and_train_finishes(
        tmp_path: Path, secrets: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The confined implementer links its copy to the host's environment and a held-out answer file: the host
    refuses the candidate (recorded with the reason), the run goes on to its end, and neither secret is stored."""
    assert bwrap_path() is not None, "bubblewrap must be installed (make setup installs it)"
    monkeypatch.setenv("HELD_OUT_FILE", str(secrets[1]))
    command = shlex.join([sys.executable, "-c", PLANTER])
    ws = make_ws(tmp_path, Roles(), ScriptedModel(add_answer, name="adder"), "train.rounds=1",
                 "train.implement_attempts=1", f"train.implementer_command={json.dumps(command)}",
                 'train.implementer_env=["HELD_OUT_FILE"]')
    result = await train_async(ws.config, "ecdysis", ws=ws)
    assert result.test_after is not None and result.final_harness_id == result.seed_harness_id
    candidate = records.load(ws.store, result.run_id, CandidateRecord, "r1")
    assert candidate is not None and candidate.harness is None
    assert candidate.error and "implementer's copy of the harness was refused" in candidate.error
    assert "heldout.txt is a symbolic link" in candidate.error or "notes.md is a symbolic link" in candidate.error
    assert not result.rounds[0].accepted
    ws.close()
    for path in [*(tmp_path / "run").rglob("*"), tmp_path / "c.sqlite"]:
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert SECRET.encode() not in data and HELD_OUT.encode() not in data, path
    with sqlite3.connect(tmp_path / "run" / DB_NAME) as db:
        for (files,) in db.execute("SELECT files FROM harness_versions"):
            assert "heldout.txt" not in files and "notes.md" not in files
