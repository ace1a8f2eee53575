"""Collect failures with objective facts, and aggregate them into patterns across instances.

Facts are computed before any role speaks (small optimizers need them): was the reply truncated,
did the action parse, which H2 rule rejected it, is the expected answer present in the reply and
inside what wrapper. A pattern seen in >= 2 distinct tasks that fail consistently is *recurring*
(a candidate harness deficiency); otherwise it is *isolated* (likely model-specific). The reason
for each class is recorded with the pattern.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from ..agent.events import (
    AnnotationEvent,
    ModelEvent,
    ObservationEvent,
    PromptEvent,
    RejectionEvent,
    RepairEvent,
    ToolErrorEvent,
)
from ..agent.realize import as_reply
from ..agent.trajectory import Trajectory
from ..envs.base import gold_text
from ..harness.api import ToolSpec, action_key
from ..harness.tool_calls import calls_in_text
from .evidence import (
    TOOL_FAILURES,
    Confusion,
    FailureExample,
    FailureFacts,
    LabelErrors,
    Pattern,
    PatternFacts,
)

SNIPPET = 500
_FILE_IN_TB = re.compile(r'File ".*?/harness/([\w./-]+)", line (\d+)')
_LAYER_OF_FILE = {"action.py": "H2", "regulate.py": "H4", "loop.py": "loop", "repairs.json": "H2"}


@dataclass
class FailureRecord:
    task_id: str
    trial: int
    termination: str
    score: float
    detail: str
    layer: str
    rules: list[str]
    annotations: list[str]
    last_replies: list[str]
    final_answer: str | None
    expected: str  # optimizer's eyes only, and only for training tasks
    facts: FailureFacts

    def evidence(self) -> FailureExample:
        """What the optimizer roles see of this failure."""
        return FailureExample(task_id=self.task_id, last_reply=self.last_replies[-1] if self.last_replies else "",
                              final_answer=self.final_answer, expected=self.expected, detail=self.detail,
                              facts=self.facts)

    @property
    def signature(self) -> str:
        return f"{self.termination}|{','.join(sorted(set(self.rules))) or '-'}|{self.layer}|{self.facts.shape}"


def reply_ending(reply: str) -> str:
    """A coarse shape of how a reply ends: the wrapper of its final answer or action."""
    tail = "\n".join(reply.strip().splitlines()[-3:])
    if "\\boxed" in tail:
        return "boxed"
    if re.search(r"^\s*Answer:\s*\S", tail, re.MULTILINE):
        return "answer_line"
    if "Final Answer:" in tail:
        return "final_answer"
    if "```" in reply and re.search(r"\b(SELECT|INSERT|UPDATE)\b", reply, re.IGNORECASE):
        return "sql_block" if "Action:" in reply else "bare_sql"
    if re.search(r"answer is", tail, re.IGNORECASE):
        return "answer_phrase"
    return "text"


def expected_text(gold: Any) -> str:
    """The expected answer as the roles read it: a list's items joined, else the gold as text."""
    if isinstance(gold, list):
        return ", ".join(str(g) for g in gold)
    text = gold_text(gold)
    return text if text is not None else str(gold)


def _gold_wrapper(reply: str, expected: str) -> str | None:
    if not expected or expected not in reply:
        return None
    for name, pattern in (("boxed", r"\\boxed\s*\{[^}]*" + re.escape(expected)),
                          ("answer_line", r"Answer:\s*\$?" + re.escape(expected)),
                          ("bold", r"\*\*[^*]*" + re.escape(expected) + r"[^*]*\*\*")):
        if re.search(pattern, reply):
            return name
    return "plain"


_TOOL_FAILURE_LAYER = {"unknown_tool": "H2", "invalid_arguments": "H2", "json_call_in_text": "H2",
                       "tool_error": "H3", "repeated_call": "H4", "no_tool_call": "H3"}


def tool_facts(traj: Trajectory) -> dict[str, int]:
    """Counts of tool-call failures in one episode (zero everywhere for episodes without schema tools), by
    `FailureFacts` field."""
    prompt = traj.of(PromptEvent)
    offered = tuple(ToolSpec.from_record(t) for t in (prompt[0].tools or [] if prompt else []))
    calls = traj.tool_calls()
    errors = Counter(e.error for e in traj.of(ToolErrorEvent))
    keys = Counter(action_key(e.tool, e.arguments, e.input) for e in calls)
    in_text = sum(1 for e in traj.of(ModelEvent) if not e.unchosen and not e.tool_calls and offered
                  and calls_in_text(as_reply(e.reply), offered) is not None)
    schema_tools = any(t.parameters is not None for t in offered)
    by_validation = {kind: errors[kind] for kind in ("unknown_tool", "invalid_arguments", "tool_error")}
    return {"tool_calls": len(calls), **by_validation,
            "repeated_call": sum(n - 1 for n in keys.values() if n > 1), "json_call_in_text": in_text,
            "no_tool_call": int(schema_tools and not calls)}


TOOL_LEVERS: dict[str, tuple[str, ...]] = {  # every tool-call failure leads somewhere, never to "leave it"
    "json_call_in_text": ("enable_repair json_in_text (see MEASURED: it turns calls written as JSON text into real "
                          "calls)", "H3 rule: call the tools through the function-calling API, never write a call "
                          "as text", "add_demo: a demonstration of a native call from a passing training task"),
    "invalid_arguments": ("enable_repair coerce_types (see MEASURED)",
                          "H3 rule or add_demo showing the argument format the schema wants"),
    "unknown_tool": ("enable_repair near_tool_name (see MEASURED)", "H3 rule listing the exact tool names"),
    "no_tool_call": ("H3 rule: the task is done only through the tools, called through the function-calling API",
                     "add_demo: a demonstration of a native call from a passing training task"),
    "repeated_call": ("H4 regulation: flag a repeated identical call and ask for a different step",
                      "H3 rule: use a call's result instead of repeating the call"),
    "tool_error": ("enable_repair error_answer (see MEASURED: an answer that restates the tool's error is sent "
                   "back with the error)", "H3 rule or H5 skill about the tool's preconditions named in the error "
                   "texts"),
}


def failure_record(traj: Trajectory, gold: Any) -> FailureRecord:
    models = traj.of(ModelEvent)
    replies = [e.reply for e in models]
    last = replies[-1] if replies else ""
    expected = expected_text(gold)
    rules = [e.rule for e in traj.of(RejectionEvent)]
    truncated = any(e.truncated for e in models)
    tool_errors = sum(1 for e in traj.of(ObservationEvent) if e.text.startswith("Error"))
    crash_file = None
    if traj.traceback:
        hits = _FILE_IN_TB.findall(traj.traceback)
        crash_file = hits[-1][0] if hits else None
    if traj.termination == "rejected":
        layer = "H2"
    elif traj.termination == "crash":
        layer = _LAYER_OF_FILE.get(crash_file or "", "runtime")
    elif traj.termination in ("timeout", "stopped", "max_turns", "budget"):
        layer = "H4"
    elif traj.termination == "model_error":
        layer = "infra"
    else:
        layer = "H2" if _gold_wrapper(last, expected) not in (None, "plain") else "model"
    facts = FailureFacts(
        shape="", truncated=truncated, answer_parsed=traj.final_answer is not None,
        expected_in_reply=bool(expected) and expected in last, expected_wrapper=_gold_wrapper(last, expected),
        tool_errors=tool_errors, turns=len(models), repairs_used=[e.name for e in traj.of(RepairEvent)],
        crash=(traj.traceback or "").strip().splitlines()[-1][:200] if traj.traceback else None,
        crash_file=crash_file, **tool_facts(traj))
    tool_kind = facts.tool_failure()
    if tool_kind and traj.termination in ("answered", "user_stop", "max_turns", "stopped", "done"):
        layer = _TOOL_FAILURE_LAYER[tool_kind]
    facts.shape = (f"tool:{tool_kind}" if tool_kind else reply_ending(last)) + ("+truncated" if truncated else "")
    return FailureRecord(
        task_id=traj.task_id, trial=traj.trial, termination=traj.termination, score=traj.score,
        detail=traj.score_detail, layer=layer, rules=rules,
        annotations=[e.text for e in traj.of(AnnotationEvent)],
        last_replies=[r[-SNIPPET:] for r in replies[-2:]], final_answer=traj.final_answer,
        expected=expected, facts=facts,
    )


def _name(records: list[FailureRecord]) -> str:
    r = records[0]
    parts = [f"ended '{r.termination}'"]
    kind = r.facts.tool_failure()
    if kind:
        parts.append(f"tool-call failure '{kind}' in {sum(1 for x in records if getattr(x.facts, kind))}/"
                     f"{len(records)}")
    if r.rules:
        parts.append(f"rejected by H2 rule '{Counter(x for rec in records for x in rec.rules).most_common(1)[0][0]}'")
    parts.append(f"reply ends with {r.facts.shape.replace('_', ' ')}")
    inside = sum(1 for x in records if x.facts.expected_in_reply)
    if inside:
        parts.append(f"expected answer present in {inside}/{len(records)} replies")
    return "; ".join(parts)


def suggest_levers(records: list[FailureRecord]) -> list[str]:
    """Environment-independent hints from the facts. Built-in H2 repairs are not guessed from reply
    shapes here: they are measured by replay (`levers.measure_repairs`) and attached to the pattern."""
    n = len(records)
    majority = lambda count: count * 2 > n  # noqa: E731
    levers: list[str] = []
    unparsed = majority(sum(not r.facts.answer_parsed for r in records))
    if unparsed and majority(sum(bool(r.rules) for r in records)):
        levers.append("H2 rejected the replies: see the measured repairs; otherwise an H3 rule + demo showing the "
                      "required final format")
    if majority(sum(r.facts.truncated for r in records)):
        levers.append("set_max_tokens up, or an H3 rule asking for brevity")
    if majority(sum(r.facts.tool_errors > 0 for r in records)):
        levers.append("H3 rule or H5 skill about the tool's syntax or preconditions named in the error texts; "
                      "enable_repair error_answer when the answers restate the error")
    tool_kinds = Counter(r.facts.tool_failure() for r in records)
    if majority(sum(r.termination in ("stopped", "max_turns") for r in records)) and not any(
            k for k in tool_kinds if k):
        levers.append("H4 budget/loop handling or an H3 rule on when to answer")
    for kind in TOOL_FAILURES:
        if tool_kinds[kind] and (majority(tool_kinds[kind]) or tool_kinds.most_common(1)[0][0] == kind):
            levers.extend(TOOL_LEVERS[kind])
    if not unparsed and not any(k for k in tool_kinds if k) and not majority(
            sum(r.facts.expected_in_reply for r in records)):
        levers.append("the answer was parsed but is wrong: a reasoning error of the model (model-level); only a "
                      "general rule (e.g. 'check each step') or a demonstration can help, tested by acceptance")
    if not levers:
        levers.append("H3 rule or H5 skill only if general; otherwise leave it (model-specific)")
    return levers


def _label_like(text: str | None) -> bool:
    return text is not None and 0 < len(text.strip()) <= 40 and len(text.split()) <= 5


def confusion_facts(records: list[FailureRecord], expected_of: dict[str, str] | None = None,
                    top: int = 5) -> tuple[list[Confusion], dict[str, LabelErrors]] | None:
    """Across failures whose answers parsed: which expected answers were given which wrong answers (the top
    pairs) and per expected answer how many tasks failed (of how many training tasks have it, when
    `expected_of` maps every training task to its expected answer). None unless the answers look like labels."""
    parsed = [r for r in records if r.final_answer is not None and _label_like(r.expected)]
    if len(parsed) < 2 or not all(_label_like(r.final_answer) for r in parsed):
        return None
    pairs = Counter((r.expected, r.final_answer.strip()) for r in parsed)  # type: ignore[union-attr]
    totals = Counter(expected_of.values()) if expected_of else None
    failing: dict[str, set[str]] = defaultdict(set)
    for r in parsed:
        failing[r.expected].add(r.task_id)
    return ([Confusion(expected=e, given=g, n=n) for (e, g), n in pairs.most_common(top)],
            {label: LabelErrors(errors=len(ids), tasks=totals[label] if totals else None)
             for label, ids in sorted(failing.items())})


def _tokens(signature: str) -> set[str]:
    return set(re.split(r"[|,+]", signature))


def aggregate(records: list[FailureRecord], outcomes: dict[str, tuple[int, int]],
              max_evidence: int = 3, merge_threshold: float = 0.6,
              expected_of: dict[str, str] | None = None) -> list[Pattern]:
    """Group failures into patterns. `outcomes[task] = (trials, passes)` over the same evaluation;
    `expected_of` (task -> expected answer text, every training task) gives the per-label error rates.

    Exact signatures first; then groups with the same termination and layer whose signature tokens
    overlap by Jaccard >= merge_threshold are merged (near-duplicates, e.g. truncated vs not).
    """
    groups: dict[str, list[FailureRecord]] = defaultdict(list)
    for record in records:
        groups[record.signature].append(record)
    merged: list[tuple[list[str], list[FailureRecord]]] = []
    for signature, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        for sigs, bucket in merged:
            head = bucket[0]
            same_kind = head.termination == members[0].termination and head.layer == members[0].layer
            a, b = _tokens(sigs[0]), _tokens(signature)
            if same_kind and len(a & b) / len(a | b) >= merge_threshold:
                sigs.append(signature)
                bucket.extend(members)
                break
        else:
            merged.append(([signature], list(members)))
    patterns: list[Pattern] = []
    for index, (sigs, bucket) in enumerate(sorted(merged, key=lambda m: -len({r.task_id for r in m[1]})), 1):
        tasks = sorted({r.task_id for r in bucket})
        consistent = [t for t in tasks if outcomes.get(t, (1, 0))[1] == 0]
        flaky = [t for t in tasks if t not in consistent]
        if len(consistent) >= 2:
            classification = "recurring"
            reason = f"{len(consistent)} distinct tasks fail this way in every trial"
            if flaky:
                reason += f"; {len(flaky)} more fail only sometimes (noise)"
        elif len(tasks) >= 2:
            classification = "isolated"
            reason = (f"{len(tasks)} tasks, but only {len(consistent)} fail consistently; the rest pass in "
                      "some trials, so this looks like model noise")
        else:
            classification = "isolated"
            reason = "seen in one task only: likely model-specific"
        confusions, label_errors = confusion_facts(bucket, expected_of) or (None, None)
        facts = PatternFacts(
            tasks=len(tasks),
            expected_in_reply=sum(r.facts.expected_in_reply for r in bucket),
            expected_wrapper=dict(Counter(str(r.facts.expected_wrapper) for r in bucket)),
            truncated=sum(r.facts.truncated for r in bucket),
            answer_parsed=sum(r.facts.answer_parsed for r in bucket),
            rules=dict(Counter(x for r in bucket for x in r.rules)),
            failures=len(bucket),
            tool_failures={k: v for k in TOOL_FAILURES if (v := sum(1 for r in bucket if getattr(r.facts, k)))},
            confusions=confusions, label_errors=label_errors)
        evidence = [r.evidence() for r in bucket[:max_evidence]]
        patterns.append(Pattern(
            id=f"P{index}", name=_name(bucket), signatures=sigs, tasks=tasks, support=len(bucket),
            layer=bucket[0].layer, classification=classification, reason=reason, facts=facts,
            levers=suggest_levers(bucket), evidence=evidence,
        ))
    return patterns
