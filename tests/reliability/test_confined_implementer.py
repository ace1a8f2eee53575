"""The external implementer (`train.implementer_command`) runs confined and bounded: it edits its copy of
the harness, and nothing else of the host is in reach (real bubblewrap, real processes)."""

from __future__ import annotations

import json
import shlex
import socket
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import BOXED_SPEC, seed_with  # noqa: E402

from ecdysis.sandbox.confine import bwrap_path  # noqa: E402
from ecdysis.trainer.checks import CheckFailed  # noqa: E402
from ecdysis.trainer.implement import ExternalCommand, Implementer, UnconfinedImplementer  # noqa: E402
from ecdysis.trainer.spec import HarnessSpec  # noqa: E402

SPEC = HarnessSpec.model_validate(BOXED_SPEC)

PROBE = r'''
import json, os, socket, sys
seen = {}
def attempt(name, fn):
    try:
        seen[name] = repr(fn())[:200]
    except Exception as exc:
        seen[name] = "blocked: " + type(exc).__name__
attempt("read_data", lambda: open(sys.argv[1]).read())
attempt("write_host", lambda: open(sys.argv[2], "w").write("escaped"))
attempt("secret", lambda: os.environ["ECDYSIS_TEST_SECRET"])
attempt("passed", lambda: os.environ["ECDYSIS_TEST_PASSED"])
attempt("connect", lambda: socket.create_connection(("127.0.0.1", int(sys.argv[3])), timeout=2).close())
attempt("spec", lambda: json.load(open("SPEC.json"))["changes"][0]["kind"])
with open("contract.md", "a") as f:
    f.write("\nAlways end with the answer in \\boxed{}.\nPROBE " + json.dumps(seen) + "\n")
'''


def implementer(command: str, timeout_s: float = 60, env_names: tuple[str, ...] = ()) -> Implementer:
    return Implementer(None, None, [], None, 1, ExternalCommand(command, timeout_s, False, env_names))  # type: ignore[arg-type]


async def test_external_implementer_edits_its_copy_and_reaches_nothing_else(
        tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert bwrap_path() is not None, "bubblewrap must be installed (make setup installs it)"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[bool] = []
    threading.Thread(target=lambda: accepted.append(bool(listener.accept())), daemon=True).start()
    monkeypatch.setenv("ECDYSIS_TEST_SECRET", "sk-not-for-the-implementer")
    monkeypatch.setenv("ECDYSIS_TEST_PASSED", "given-on-purpose")
    data_file = next((data_dir / "gsm8k").iterdir())
    host_file = tmp_path / "outside.txt"
    command = shlex.join([sys.executable, "-c", PROBE, str(data_file), str(host_file),
                          str(listener.getsockname()[1])])
    files = await implementer(command, env_names=("ECDYSIS_TEST_PASSED",))._external(seed_with("gsm8k"), SPEC)
    contract = files["contract.md"]
    assert "Always end with the answer in \\boxed{}." in contract  # its edit came back
    seen = json.loads(contract.split("PROBE ", 1)[1].splitlines()[0])
    assert seen["read_data"].startswith("blocked"), seen  # task data with gold answers is not mounted
    assert seen["write_host"].startswith("blocked") and not host_file.exists()
    assert seen["secret"].startswith("blocked") and seen["passed"] == "'given-on-purpose'"
    assert seen["connect"].startswith("blocked") and not accepted  # no network by default
    assert seen["spec"] == "'enable_repair'"
    assert "SPEC.json" not in files


async def test_external_implementer_is_killed_at_its_timeout(tmp_path: Path) -> None:
    command = shlex.join([sys.executable, "-c", "import time; time.sleep(60)"])
    start = time.perf_counter()
    with pytest.raises(CheckFailed, match=r"timed out after 2s \(train.implementer_timeout_s\)"):
        await implementer(command, timeout_s=2)._external(seed_with("gsm8k"), SPEC)
    assert time.perf_counter() - start < 15


async def test_external_implementer_failure_reports_its_output() -> None:
    command = shlex.join([sys.executable, "-c", "import sys; print('no API key configured'); sys.exit(3)"])
    with pytest.raises(CheckFailed, match="exited with 3: no API key configured"):
        await implementer(command)._external(seed_with("gsm8k"), SPEC)


@pytest.fixture()
def no_bwrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A PATH without `bwrap` (so bubblewrap is unavailable), restored afterwards."""
    monkeypatch.setenv("PATH", str(tmp_path))
    bwrap_path.cache_clear()
    assert bwrap_path() is None
    yield
    monkeypatch.undo()
    bwrap_path.cache_clear()


EDIT = shlex.join([sys.executable, "-c", "open('contract.md', 'a').write('\\nAlways end with the answer.\\n')"])


async def test_without_bubblewrap_the_external_implementer_is_refused_naming_the_setting(no_bwrap) -> None:  # type: ignore[no-untyped-def]
    train = SimpleNamespace(implementer_command=EDIT, implementer_timeout_s=60, implementer_network=False,
                            implementer_env=[], implementer_unconfined=False)
    with pytest.raises(UnconfinedImplementer, match=r"train\.implementer_unconfined = true"):
        ExternalCommand.from_config(train)  # a train run stops before its first round
    with pytest.raises(UnconfinedImplementer, match=r"train\.implementer_unconfined = true"):
        await implementer(EDIT).build(seed_with("gsm8k"), SPEC, [])  # not a failed sample


async def test_allowed_unconfined_it_runs_warns_and_the_round_records_it(no_bwrap, capsys) -> None:  # type: ignore[no-untyped-def]
    train = SimpleNamespace(implementer_command=EDIT, implementer_timeout_s=60, implementer_network=False,
                            implementer_env=[], implementer_unconfined=True)
    external = ExternalCommand.from_config(train)
    assert external is not None
    candidate = await Implementer(None, None, [], None, 1, external).build(  # type: ignore[arg-type]
        seed_with("gsm8k"), SPEC, [])
    assert candidate.version is not None and "Always end with the answer." in candidate.version.files["contract.md"]
    assert "external implementer isolation: unconfined (train.implementer_unconfined = true)" in candidate.applied
    assert "runs with no confinement" in capsys.readouterr().err
