"""Model faults from a real llama.cpp server behind a fault-injecting proxy on 127.0.0.1: a real `ecdysis eval`
process retries within bounds, records what happened (retries per reply; a model_error episode when a 429
storm outlasts the retries) and finishes."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_proxy import FaultProxy  # noqa: E402

SEED = Path(__file__).resolve().parents[2] / "src" / "ecdysis" / "harness" / "seeds" / "jsonl"

MAX_RETRIES = 3
# long enough for a real reply of SmolLM2 on 2 busy cores (a slower reply would count as one more retry and shift
# the plan), short of the proxy's `timeout` fault
ATTEMPT_TIMEOUT_S = 20
# request by request: each group ends in a pass, so its reply arrives after len(group) - 1 retries;
# the storm (MAX_RETRIES + 1 429s) exhausts one call's retries
GROUPS = [["429", "429", "pass"], ["500", "503", "pass"], ["disconnect", "pass"], ["garbage", "empty", "pass"],
          ["timeout", "pass"]]
STORM = ["429"] * (MAX_RETRIES + 1)
TASKS = [{"id": f"t{i}", "prompt": f"What is {i} plus 1? Reply with the number only.", "answer": str(i + 1),
          "split": "test"} for i in range(7)]


def test_eval_survives_injected_faults_and_records_them(tmp_path: Path,
                                                        llama_server: tuple[subprocess.Popen[bytes], str]) -> None:
    _, upstream = llama_server
    proxy = FaultProxy(upstream, [f for group in GROUPS for f in group] + STORM, slow_s=ATTEMPT_TIMEOUT_S + 10)
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    # one model call per episode whatever the model writes: the fault plan is consumed request by request, so a
    # reply the seed rejects (and the extra call its feedback costs) must not shift it
    harness = shutil.copytree(SEED, tmp_path / "harness")
    manifest = harness / "harness.toml"
    manifest.write_text(manifest.read_text().replace("max_rejections = 1", "max_rejections = 0"))
    assert "max_rejections = 0" in manifest.read_text()
    ref = f"{proxy.base}::smol"
    settings = f'model_settings."{ref}"'
    out = subprocess.run(
        [sys.executable, "-m", "ecdysis", "eval", "--env", "jsonl", "--tasks", "tasks.jsonl", "--model", ref,
         "--harness", str(harness),
         "--split", "test", "--run-dir", "run", "--concurrency", "1", "--json", "--set", "cache.enabled=false",
         "--set", f"{settings}.max_retries={MAX_RETRIES}", "--set", f"{settings}.attempt_timeout_s={ATTEMPT_TIMEOUT_S}",
         "--set", f"{settings}.total_timeout_s=300"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    proxy.close()
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout)
    assert summary["episodes"] == len(TASKS)  # every task recorded: the batch finished
    with sqlite3.connect(tmp_path / "run" / "ecdysis.sqlite") as db:
        trajectories = [json.loads(r[0]) for r in db.execute("SELECT data FROM trajectories ORDER BY created")]
    models = [e for t in trajectories for e in t["events"] if e["kind"] == "model"]
    assert [e["retries"] for e in models[:len(GROUPS)]] == [len(g) - 1 for g in GROUPS]
    assert summary["model_retries"] == sum(len(g) - 1 for g in GROUPS)
    storm = [t for t in trajectories if t["termination"] == "model_error"]
    assert len(storm) == 1 and "HTTP 429" in json.dumps(storm[0])  # the storm's episode says what happened
    assert proxy.served[:len(GROUPS[0])] == GROUPS[0] and proxy.served.count("429") == 2 + len(STORM)
