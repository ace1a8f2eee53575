"""The command line for a researcher (scripted models, real subprocesses): compare's model flags and table,
wording that says what happened, output width, `init --model`, `train --json`, `train --from-traces`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from ecdysis.compare.results import ArmResult, add_ratios
from ecdysis.store import RunStore

SEVEN = "scripted:The answer is 7"  # right on the "sevens" suite once `answer_phrase` is enabled
CAREFUL_RULE = {"patterns_addressed": ["P1"], "changes": [{
    "layer": "H3", "kind": "add_rule", "file": "", "text": "Read the question once more before you answer.",
    "repair": "", "value": 0, "rationale": "general"}], "skills": [], "implementation_notes": "", "expected_effect": ""}
TOPICS = {"sports": ["The striker scored in the cup final", "The keeper saved a penalty in the final",
                     "The team won the league final", "The striker missed a penalty in the cup",
                     "The keeper scored in the league final", "The coach lost the cup match"],
          "politics": ["Parliament passed the budget vote", "The senator won the election vote",
                       "The minister lost the budget vote", "The senator called an election vote",
                       "Parliament lost the election vote", "The minister called a budget vote"]}
SIGNED_PERCENT = re.compile(r"[+-]\d+\.\d%")


def ecdysis(*args: str, cwd: Path, columns: str | None = "400",
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess with its output piped; `columns` is COLUMNS (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
    return subprocess.run([sys.executable, "-m", "ecdysis", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def suite(tmp_path: Path, name: str, rows: list[dict[str, str]], *init_args: str) -> Path:
    """`rows` as a JSONL task file and a project initialised from it; returns its config."""
    (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = ecdysis("init", name, "--env", "jsonl", "--tasks", f"{name}.jsonl", *init_args, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    return tmp_path / name / "ecdysis.toml"


def split(i: int) -> str:
    return "train" if i < 6 else "val" if i < 10 else "test"


def sevens(tmp_path: Path, *init_args: str) -> Path:
    """Every answer is 7: the seed rejects "The answer is 7", and `answer_phrase` measurably fixes every task."""
    return suite(tmp_path, "sevens", [{"id": f"s{i}", "prompt": f"What is {i} + {7 - i}?", "answer": "7",
                                       "split": split(i)} for i in range(12)], *init_args)


def sums(tmp_path: Path) -> Path:
    """Answers 1..12: "The answer is 7" is wrong on nearly all, so no measured lever helps and the roles are asked."""
    return suite(tmp_path, "sums", [{"id": f"n{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1),
                                     "split": split(i)} for i in range(12)])


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of a rich table printed in `text` (title and section rows included)."""
    return [[c.strip() for c in line.strip().strip("│").split("│")] for line in text.splitlines()
            if line.startswith("│")]


# ---- compare ----------------------------------------------------------------------------------------------

def test_compare_takes_the_models_as_flags_and_shows_only_meaningful_rows(tmp_path: Path) -> None:
    config = sevens(tmp_path)
    # serial, as published, gets no library spec: its roles write the fix themselves (ecdysis takes the measured lever)
    roles = "scripted:" + json.dumps({**CAREFUL_RULE, "changes": [{
        "layer": "H2", "kind": "enable_repair", "file": "", "text": "", "repair": "answer_phrase", "value": 0,
        "rationale": "the replies say 'the answer is'"}]})
    out = ecdysis("compare", "-c", str(config), "--arms", "fixed,serial,ecdysis", "--model", SEVEN,
                  "--roles-model", roles, "--run-dir", "cmp", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    store = RunStore(tmp_path / "cmp")
    trained = [json.loads(r["config"]) for r in store.runs() if r["kind"] == "train"]
    assert len(trained) == 2 and all(c["agent"]["model"] == SEVEN for c in trained)
    assert all(c["roles"][r] == roles for c in trained for r in ("analyst", "critic", "moderator"))

    rows = table_rows(out.stdout)
    header = next(line for line in out.stdout.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == ["measure", "fixed s0", "serial s0", "ecdysis s0"]
    titles = [i for i, r in enumerate(rows) if r[0] and all(c == "" for c in r[1:])]
    assert [rows[i][0] for i in titles] == ["accuracy (0-1)", "training cost",
                                            "ratios (x: times the other arm's; %: relative change)"]
    measures = [r for i, r in enumerate(rows) if i not in titles and r[0] != "measure"]
    assert measures and not [r for r in measures if all(c == "–" for c in r[1:])]  # no row of dashes
    ratios_from = titles[2]
    for i, r in enumerate(rows):  # relative changes only in the ratios section
        if any(SIGNED_PERCENT.fullmatch(c) for c in r[1:]):
            assert i > ratios_from, r
    by_label = {r[0]: r[1:] for r in measures}
    assert by_label["test acc vs serial's (relative change)"][0] == "-100.0%"  # fixed 0.0 vs serial 1.0
    assert "agent episodes vs serial's (arm's / serial's)" in by_label
    assert by_label["training wall s"][0] == "–"  # the fixed harness does not train
    assert "test acc vs fixed's (relative change)" not in by_label  # fixed scored 0: no relative gain
    assert "over 1 seed" not in out.stdout and "one seed per arm: no confidence interval" in out.stdout

    run = next(r["id"] for r in store.runs() if r["id"].startswith("train-ecdysis"))
    report = ecdysis("report", run, "--run-dir", "cmp", "-o", "report.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "report.html").read_text()
    table = html[html.index('<div class="card scroll"><table id="compare"'):]
    table = table[:table.index("</table>")]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in table.split("<tr")]
    assert [c for c in cells if len(c) > 1 and all(x == "–" for x in c[1:])] == []
    assert "ratios (x: times the other arm&#39;s; %: relative change)" in table and "-100.0%" in table


def test_ratios_read_the_right_way_round_and_one_seed_has_no_interval() -> None:
    from ecdysis.compare.results import summary_tables
    from ecdysis.compare.table import compare_sections

    serial = ArmResult("serial", 0, train_wall_s=400.0, agent_executions=80, test_acc=0.5)
    ecdysis_arm = ArmResult("ecdysis", 0, train_wall_s=200.0, agent_executions=112, test_acc=0.0)
    fixed = ArmResult("fixed", 0, test_acc=0.25)
    results = [fixed, serial, ecdysis_arm]
    add_ratios(results)
    rows = {label: cells for s in compare_sections(results) for label, cells in s.rows}
    assert rows["agent episodes vs serial's (arm's / serial's)"] == ["–", "–", "1.40x"]  # 40% more than serial
    assert rows["speed-up vs serial (serial's training s / arm's)"] == ["–", "–", "2.00x"]
    assert rows["test acc vs fixed's (relative change)"] == ["–", "+100.0%", "-100.0%"]
    assert rows["test acc - fixed's (difference)"] == ["–", "+0.250", "-0.250"]
    sections = {s.title: [label for label, _ in s.rows] for s in compare_sections(results)}
    assert "test acc vs fixed's (relative change)" not in sections["accuracy (0-1)"]
    assert summary_tables(results) == []  # one seed: nothing to put an interval on
    second = [ArmResult(r.arm, 1, train_wall_s=r.train_wall_s, agent_executions=r.agent_executions,
                        test_acc=r.test_acc) for r in results]
    add_ratios(second)
    tables = summary_tables(results + second)
    assert [str(t.title).split(" (")[0] for t in tables] == ["Mean ± 95% CI over 2 seeds",
                                                              "Mean ± 95% CI over 2 seeds, ratios"]


# ---- wording ----------------------------------------------------------------------------------------------

def test_a_round_no_role_ran_says_the_library_wrote_its_spec(tmp_path: Path) -> None:
    config = sevens(tmp_path)
    out = ecdysis("train", "-c", str(config), "--model", SEVEN, "--roles-model", "scripted:unused",
                  "--run-dir", "r", "--arm", "ecdysis", "--set", "train.acceptance=strict", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "spec written by the library (enable_repair answer_phrase covers every recurring pattern; no role " \
           "asked)" in out.stdout
    assert ("round 1: accepted [whole spec] - val 0.000 -> 1.000: improves; the library's spec: enable_repair "
            "answer_phrase (enable_repair answer_phrase covers every recurring pattern; no role asked)") in out.stdout
    assert "the roles wrote" not in out.stdout and "roles'" not in out.stdout
    assert re.search(r"optimizer calls / tokens\s+│ 0 / 0", out.stdout)
    # the seed ran on 6 train + 4 val tasks; the repair changes no prompt, so the candidate's episodes on them
    # are served from the response cache
    assert ("10 run by the model + 10 served from the response cache (not counted in agent_executions) = 20"
            in out.stdout)
    assert "cache-served" not in out.stdout


def test_two_rejections_stop_training_and_the_library_candidate_is_named(tmp_path: Path) -> None:
    rows = [{"id": f"{g[0]}{i}", "prompt": f"Which topic: {text}", "answer": g,
             "split": "train" if i < 3 else "val" if i < 5 else "test"}
            for g, texts in TOPICS.items() for i, text in enumerate(texts)]
    config = suite(tmp_path, "topics", rows)
    out = ecdysis("train", "-c", str(config), "--model", "scripted:Answer: sports",
                  "--roles-model", f"scripted:{json.dumps(CAREFUL_RULE)}", "--run-dir", "r", "--arm", "ecdysis",
                  "--set", "train.acceptance=strict", cwd=tmp_path)  # the wording of a strict decision
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no edit accepted in 2 rounds in a row (train.engine.stop_after_rejections = 2)" in out.stdout
    assert "nothing accepted twice" not in out.stdout
    # round 2: the roles wrote round 1's rejected rule again, so the library's retrieved examples ran instead
    assert "the spec above gave no new candidate that runs; validating the library's add_examples instead" \
        in out.stdout
    assert "decision: rejected (the library's add_examples: val 0.500 -> 0.500: no strict gain)" in out.stdout
    assert ("round 2: rejected - val 0.500 -> 0.500: no strict gain; validated the library's add_examples: the "
            "roles' spec gave no new candidate that runs (add_rule Read the question once more") in out.stdout
    assert "round 1: rejected [whole spec] - val 0.500 -> 0.500: no strict gain; the roles' spec: add_rule" \
        in out.stdout


def test_a_role_reply_that_is_not_json_is_named_with_its_start(tmp_path: Path) -> None:
    config = sums(tmp_path)
    out = ecdysis("train", "-c", str(config), "--model", SEVEN, "--roles-model", "scripted:I think we should fix it",
                  "--run-dir", "r", "--arm", "ecdysis", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("spec rejected after repair: the role's reply is not JSON (Expecting value at line 1 column 1); "
            "it starts: 'I think we should fix it'") in out.stdout
    assert "does not match the schema" not in out.stdout
    assert "round 1: no candidate - spec rejected after repair" in out.stdout  # nothing was built or validated


def test_piped_output_honours_columns_and_has_a_sane_default(tmp_path: Path) -> None:
    config = sums(tmp_path)
    args = ("train", "-c", str(config), "--model", SEVEN, "--roles-model", "scripted:I think we should fix it",
            "--run-dir", "r", "--arm", "ecdysis")
    narrow = ecdysis(*args, cwd=tmp_path, columns="100")
    assert narrow.returncode == 0, narrow.stderr
    assert max(map(len, layout(narrow.stdout))) <= 100 and max(map(len, layout(narrow.stderr))) <= 100
    # piped, a line of text is never broken, so grep finds it whole
    assert "round 1: no candidate - spec rejected after repair: the role's reply is not JSON" in narrow.stdout
    default = ecdysis(*args, cwd=tmp_path, columns=None)  # resumes the same run: the same screen
    assert default.returncode == 0, default.stderr
    assert 100 < max(map(len, layout(default.stdout))) <= 120


def layout(text: str) -> list[str]:
    """The lines of tables, rules and progress bars: what is laid out to the width."""
    return [line for line in text.splitlines() if line[:1] in "┏┃┡│├└┌─━" or "━" in line]


# ---- onboarding -------------------------------------------------------------------------------------------

def test_init_writes_the_models_into_the_config(tmp_path: Path) -> None:
    config = sevens(tmp_path, "--model", "scripted:Answer: 7", "--roles-model", "scripted:roles")
    text = config.read_text()
    assert 'model = "scripted:Answer: 7"' in text and 'moderator = "scripted:roles"' in text
    out = ecdysis("eval", "-c", str(config), "--split", "train", "--run-dir", "r", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr  # no --model: the config's scripted model, no GGUF loaded
    assert json.loads(out.stdout)["accuracy"] == 1.0
    plain = ecdysis("init", "plain", "--env", "jsonl", "--tasks", "sevens.jsonl", cwd=tmp_path)
    assert plain.returncode == 0 and "agent model: local:qwen2.5-coder-1.5b (default:" in plain.stdout
    assert "--model REF" in plain.stdout
    bad = ecdysis("init", "bad", "--env", "jsonl", "--tasks", "sevens.jsonl", "--model", "gpt4", cwd=tmp_path)
    assert bad.returncode == 2 and "--model: unknown model reference 'gpt4'" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_train_json_prints_the_typed_result(tmp_path: Path) -> None:
    config = sevens(tmp_path)
    out = ecdysis("train", "-c", str(config), "--model", SEVEN, "--run-dir", "r", "--arm", "ecdysis", "--json",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)  # stdout holds the JSON and nothing else
    assert result["run_id"].startswith("train-ecdysis-") and result["arm"] == "ecdysis"
    assert result["test_before"]["accuracy"] == 0.0 and result["test_after"]["accuracy"] == 1.0
    assert result["stop_reason"] == "nothing recurring left" and result["final_harness_id"] != result["seed_harness_id"]
    assert result["agent_executions"] == 10 and result["cached_executions"] == 10  # as in the test above
    assert [r["accepted"] for r in result["rounds"]] == [True, False] and result["curve"][0]["step"] == 0
    assert Path(result["report"]).exists() and result["run_dir"] == "r"
    assert f"new run {result['run_id']}" in out.stderr


HARNESS_TOML = """name = "served"
env = "helpdesk"
tool_calling = "native"

[budget]
max_turns = 4
max_rejections = 1

[files]
action = ""
skills = ""
demos = ""
regulate = ""
"""


def test_from_traces_without_gold_says_it_wrote_no_candidate(tmp_path: Path) -> None:
    """Served conversations have no gold answers: no retrieved labelled examples are suggested, and when no
    repair can be verified by replay the command says that it wrote no candidate, and why."""
    from ecdysis.serve.server import background, build_proxy

    harness = tmp_path / "served"
    harness.mkdir()
    (harness / "harness.toml").write_text(HARNESS_TOML)
    (harness / "contract.md").write_text("Answer the customer.\nTools:\n{tools}\n")
    proxy = build_proxy(harness, "scripted:Your order has shipped.", store_dir=tmp_path / "store")
    with background(proxy) as base:
        for i in range(6):  # the same wrong reply; the agent's own check fails four of them
            r = httpx.post(f"{base}/chat/completions", timeout=60, json={
                "model": "m", "messages": [{"role": "user", "content": f"Where is my refund for order {i}?"}]})
            httpx.post(f"{base}/conversations/{r.headers['x-ecdysis-conversation']}/outcome",
                       json={"passed": i >= 4}, timeout=60).raise_for_status()
    out = ecdysis("train", "--from-traces", "store", "--out", "proposal", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "6 scored conversations (4 failing)" in out.stdout and "[recurring, model]" in out.stdout
    assert "gold answers" not in out.stdout and "add_examples" not in out.stdout
    assert ("no candidate harness written: no built-in H2 repair acts on the failing conversations without "
            "changing a passing one") in out.stdout
    assert not (tmp_path / "proposal" / "harness").exists()
    as_json = ecdysis("train", "--from-traces", "store", "--out", "again", "--json", cwd=tmp_path)
    report = json.loads(as_json.stdout)
    assert report["candidate_id"] is None and report["no_candidate"].startswith("no built-in H2 repair")


def test_a_per_failure_step_prints_one_decision_naming_its_task(tmp_path: Path) -> None:
    rows = [{"id": f"{g[0]}{i}", "prompt": f"Which topic: {text}", "answer": g,
             "split": "train" if i < 3 else "val" if i < 5 else "test"}
            for g, texts in TOPICS.items() for i, text in enumerate(texts)]
    config = suite(tmp_path, "topics", rows)
    out = ecdysis("train", "-c", str(config), "--model", "scripted:Answer: sports", "--run-dir", "r",
                  "--roles-model", f"scripted:{json.dumps(CAREFUL_RULE)}", "--set", "train.rounds=1",
                  "--set", "train.acceptance=strict", cwd=tmp_path)  # the default method: a step per failing task
    assert out.returncode == 0, out.stdout + out.stderr
    decisions = [line for line in out.stdout.splitlines() if line.startswith("decision: ")]
    validated = [line for line in decisions if "val 0.500 -> " in line]  # a candidate ran on val
    assert validated, out.stdout
    assert all(re.match(r"decision: (accepted|rejected) \(serial edit for p\d, ", line) for line in decisions), \
        decisions
    assert len(decisions) == len(set(decisions)), decisions  # one line a step, not the engine's and the schedule's
