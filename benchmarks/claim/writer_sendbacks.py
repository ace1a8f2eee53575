"""Why the spec writer's first reply was sent back, round by round: replays a compare arm with the writer's checks
logged (LOG is rewritten), then counts each round's first-reply outcome and whether the repair reply passed the
parse. Nothing the run decides changes (the checks are wrapped, not altered), so on the code and cache the arm
ran with, the replay makes no model call and reproduces its numbers; on other code (main's writer prompts and
grammar differ from the pinned experiment's) its requests miss the cache and the model is called.

    # on the experiment's pinned code (a copy of its src/), from the shared response cache, into a scratch dir:
    git archive $(cat benchmarks/claim/experiment.commit) src | tar -x -C /tmp/pinned
    ECDYSIS_RATES=benchmarks/claim/rates-v4.toml PYTHONPATH=/tmp/pinned/src .venv/bin/python \
        benchmarks/claim/writer_sendbacks.py /tmp/agg3.jsonl compare -c benchmarks/designed/compare.toml \
        --arms aggregate --seeds 1 --set run.seed=3 --run-dir /tmp/replay-agg3
    .venv/bin/python benchmarks/claim/writer_sendbacks.py /tmp/agg3.jsonl     # the counts only
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path


def instrument(log_path: Path) -> None:
    """Wrap the writer's spec call and its three checks so each appends one JSON line to `log_path`."""
    import ecdysis.trainer.fdcr as fdcr

    log = log_path.open("w")

    def note(**row: object) -> None:
        log.write(json.dumps(row) + "\n")
        log.flush()

    parse, ignored, useless, say = (fdcr.parse_spec, fdcr.ignored_verified_lever, fdcr.repairs_without_gain,
                                    fdcr.SpecWriter._say)

    def parse_spec(text, harness, ids):  # type: ignore[no-untyped-def]
        try:
            return parse(text, harness, ids)
        except fdcr.SpecError as exc:
            note(check="parse", why=str(exc)[:300])
            raise

    def checked(name, check):  # type: ignore[no-untyped-def]
        def run(spec, patterns):  # type: ignore[no-untyped-def]
            why = check(spec, patterns)
            note(check=name, why=why)
            return why
        return run

    async def spec_call(self, role, prompt, schema=None, history=None):  # type: ignore[no-untyped-def]
        if schema is not None:  # only the spec call and its repair carry the JSON schema
            note(check="writer_call", attempt=len(history or []) // 2)
        return await say(self, role, prompt, schema, history)

    fdcr.parse_spec = parse_spec
    fdcr.ignored_verified_lever = checked("ignored_verified_lever", ignored)
    fdcr.repairs_without_gain = checked("repairs_without_gain", useless)
    fdcr.SpecWriter._say = spec_call


def first_replies(rows: list[dict]) -> Counter[tuple[str, str]]:
    """Per round (a first spec call): what the first reply met (the first failing check, or `passed`), and what
    followed: `no repair call`, or the repair reply's parse (`repair passed` / `repair failed`; a repair reply
    is only parsed, the other checks are the first reply's)."""
    out: Counter[tuple[str, str]] = Counter()
    calls = [i for i, r in enumerate(rows) if r["check"] == "writer_call"] + [len(rows)]
    for n, i in enumerate(calls[:-1]):
        if rows[i]["attempt"] != 0:
            continue
        why = next((f"{r['check']}: {r['why']}" for r in rows[i + 1:calls[n + 1]]
                    if r["check"] == "parse" or r["why"]), "passed")
        why = re.sub(r"\(([^()]*)\)", "(...)", why)[:90]
        then = "no repair call"
        if calls[n + 1] < len(rows) and rows[calls[n + 1]]["attempt"] == 1:
            failed = any(r["check"] == "parse" for r in rows[calls[n + 1] + 1:calls[n + 2]])
            then = "repair failed" if failed else "repair passed"
        out[(why, then)] += 1
    return out


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__)
    log = Path(argv[0])
    if len(argv) > 1:
        instrument(log)
        from ecdysis.cli.main import app

        try:
            app(argv[1:])
        except SystemExit as done:
            if done.code:
                raise
    rounds = first_replies([json.loads(line) for line in log.read_text().splitlines() if line.strip()])
    repaired = sum(v for (_, then), v in rounds.items() if then != "no repair call")
    print(f"{sum(rounds.values())} rounds; {repaired} paid a repair call")
    for (why, then), count in rounds.most_common():
        print(f"{count:4d}  {then:14s}  {why}")


if __name__ == "__main__":
    main(sys.argv[1:])
