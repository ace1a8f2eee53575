"""Generic, parameterised H2 repairs that a harness enables by name in `repairs.json`.

When the harness's own `realize` rejects a reply, the enabled repairs are tried in order; the
first that recovers an action wins and the episode records which one. Small optimizer models can
pull this lever reliably (a one-word JSON edit) where writing parser code is beyond them; every
repair is deterministic, so its effect is verified by replaying stored replies.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from . import tool_calls
from .api import Action, ActionContext, Reject, Reply, ToolSpec, answer

REPAIRS_FILE = "repairs.json"
NUMBER = r"-?\$?\s*[\d,]*\.?\d+"
_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_PHRASE = re.compile(r"(?:final answer|the answer)\s*(?:is|:)\s*[:\s]*\**\s*([^\n*]{1,60})", re.IGNORECASE)
_LEAD = re.compile(r"^\s*(?:\**\s*(?:final\s+)?answer\s*\**\s*[:\-]\s*)?\**\s*", re.IGNORECASE)
_NUM = re.compile(NUMBER)
_FINAL = re.compile(r"Final Answer:\s*(.+)", re.DOTALL)
_CODE = re.compile(r"```(?:sql|sqlite)?\s*(.+?)```", re.DOTALL | re.IGNORECASE)
_SQL_LINE = re.compile(r"^\s*((?:SELECT|INSERT|UPDATE|DELETE|WITH)\b.+?;?)\s*$",
                       re.IGNORECASE | re.MULTILINE | re.DOTALL)


def _clean_number(text: str) -> str | None:
    found = _NUM.findall(text.replace("\\$", "$"))
    if not found:
        return None
    return found[-1].replace("$", "").replace(",", "").strip()


def boxed_answer(reply: str, tools: tuple[ToolSpec, ...]) -> Action | None:
    found = _BOXED.findall(reply)
    if not found:
        return None
    value = _clean_number(found[-1])
    return answer(value if value is not None else found[-1].strip())


def answer_phrase(reply: str, tools: tuple[ToolSpec, ...]) -> Action | None:
    """'the answer is N' / 'Final answer: X': a number if the phrase holds one, else its short text."""
    found = _PHRASE.findall(reply)
    if not found:
        return None
    first = _NUM.search(found[-1].replace("\\$", "$"))  # the number right after the phrase
    if first is not None:
        return answer(first.group(0).replace("$", "").replace(",", "").strip())
    text = found[-1].strip().rstrip(".").strip()
    return answer(text) if text and len(text.split()) <= 6 else None


def last_line(reply: str, tools: tuple[ToolSpec, ...]) -> Action | None:
    """Single-turn: a short last line (at most 8 words) is the answer ('No.', '**B**', 'Answer - 12')."""
    if tools:
        return None
    lines = [line for line in reply.strip().splitlines() if line.strip()]
    if not lines:
        return None
    text = _LEAD.sub("", lines[-1]).strip().strip("*").strip().rstrip(".").strip()
    return answer(text) if text and len(text.split()) <= 8 else None


def last_number(reply: str, tools: tuple[ToolSpec, ...]) -> Action | None:
    if tools:
        return None
    value = _clean_number(reply)
    return answer(value) if value is not None else None


def final_answer_anywhere(reply: str, tools: tuple[ToolSpec, ...]) -> Action | None:
    found = _FINAL.search(reply)
    return answer(found.group(1).strip()) if found else None


def bare_sql(reply: str, tools: tuple[ToolSpec, ...]) -> Action | None:
    if not any(t.name == "sql" for t in tools) or "Final Answer:" in reply:
        return None
    block = _CODE.search(reply) or _SQL_LINE.search(reply)
    return Action("sql", block.group(1).strip()) if block else None


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def answer_set(action: Action, choices: tuple[str, ...]) -> Action | Reject | None:
    """`answer_set`: a final answer outside the task's declared answer set is mapped to the one allowed
    answer it names (same words ignoring case and punctuation; else the only allowed answer contained in it as
    whole words; else the only close spelling), or rejected with the allowed set as feedback."""
    if not choices or not action.is_answer:
        return None
    given = _norm(action.input)
    if action.input in choices:
        return None
    same = [c for c in choices if _norm(c) == given]
    if not same:
        same = [c for c in choices if _norm(c) and re.search(rf"(?<![a-z0-9]){re.escape(_norm(c))}(?![a-z0-9])", given)]
        if len(same) > 1:  # "not A but B": prefer the longest, unless two unrelated labels are named
            longest = max(same, key=len)
            same = [longest] if all(_norm(c) in _norm(longest) for c in same) else []
    if not same:
        import difflib

        same = difflib.get_close_matches(action.input.strip(), list(choices), n=2, cutoff=0.8)
    if len(same) == 1:
        return answer(same[0])
    allowed = ", ".join(choices[:40])
    return Reject(f"Your answer {action.input.strip()[:80]!r} is not one of the allowed answers. "
                  f"Reply with exactly one of: {allowed}.", rule="answer-set")


# unit words after which the bare number means something else: a scale, a fraction, arithmetic, an era or a
# time of day, a date ('5 March'), a direction ('5 degrees below zero'); compared without a plural 's'
_NOT_A_UNIT = frozenset("""
    hundred thousand million billion trillion lakh crore grand dozen score k bn mn tn
    half halve third quarter fourth fifth sixth seventh eighth ninth tenth hundredth thousandth millionth
    and plus minus time squared cubed pi power root over of
    bc bce ad ce am pm a.m p.m below above under less more than before after ago
    january february march april may june july august september october november december
    jan feb mar apr jun jul aug sep sept oct nov dec
""".split())
_FORMATTED = re.compile(
    r"(?P<sign>[-+\u2212]?)\s*(?:[$\u20ac\u00a3\u00a5]|usd|eur|gbp)?\s*"
    r"(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?\s*"
    r"(?P<unit>%|[a-z][a-z/.-]*(?:\s+[a-z][a-z/.-]*){0,2})?\s*\.?", re.IGNORECASE)


def _a_unit(words: list[str]) -> bool:
    """Whether the words after a number are a unit to drop: no word of `_NOT_A_UNIT` (plural or not), and not a
    lone letter ('3x', '5i', '5 m', '5B': a variable, or a scale or metre it cannot tell apart)."""
    if len(words) == 1 and len(words[0].strip("./-")) == 1:
        return False
    stems = {w.lower().strip("./-") for w in words}
    return not any(w in _NOT_A_UNIT or w.removesuffix("s") in _NOT_A_UNIT for w in stems)


def plain_number(action: Action, ctx: ActionContext) -> Action | None:
    """`plain_number`: a final answer that is one number written with thousands separators, a currency sign or
    a unit ('30,000', '$1,200.50', '12 apples', '45%') becomes the plain number ('30000', '1200.50', '12',
    '45'). Nothing else changes: an answer that is already plain, holds two numbers, words before the number,
    words after it that change what it means ('1.5 million', '2 thirds', '100 BC', '5 March', '3x'), or a task
    with a declared answer set."""
    if ctx.choices or not action.is_answer:
        return None
    found = _FORMATTED.fullmatch(action.input.strip())
    if found is None or (found.group("unit") not in (None, "%") and not _a_unit(found.group("unit").split())):
        return None
    sign = "-" if found.group("sign") in ("-", "\u2212") else ""
    plain = sign + found.group("int").replace(",", "") + (found.group("frac") or "")
    return answer(plain) if plain != action.input.strip() else None


_ERROR = re.compile(r"^[\s*`]*(?:error|exception|traceback|failed|invalid)\b", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9_]+")


def tool_error(observation: str) -> str | None:
    """The first line of an observation that reports a failed action (it starts with 'Error', 'Exception',
    'Traceback', 'Failed' or 'Invalid'), else None."""
    lines = observation.strip().splitlines()
    return lines[0][:200] if lines and _ERROR.match(lines[0]) else None


def error_answer(action: Action, ctx: ActionContext) -> Reject | None:
    """`error_answer`: a final answer that restates the error the previous action returned (the agent gave up
    and reported the failure as the answer) is rejected with the error as feedback, so the agent fixes the
    action and runs it again. It fires only when the previous observation is an error and the answer either
    names an error or repeats most of that error's words."""
    if not action.is_answer or not (error := tool_error(ctx.last_observation)):
        return None
    said = set(_WORD.findall(action.input.lower()))
    words = set(_WORD.findall(error.lower()))
    if not said or not ({"error", "exception", "traceback"} & said or len(said & words) >= 0.6 * len(said)):
        return None
    return Reject(f"Your last action failed: {error}\nThat error is not the answer. Fix the action and run it "
                  "again, then give the final answer from its result.", rule="error-answer")


Stage = Literal["reply", "message", "call", "turn", "answer"]


@dataclass(frozen=True)
class Repair:
    """A named deterministic repair. Where it acts (`stage`):

    reply   after `realize` rejected a reply: (text, tools) -> Action | None
    message before `realize`: (Reply, tools) -> Reply | None (e.g. calls written in the text)
    call    on one action that failed validation: (Action, tools) -> Action | None
    turn    on the actions of one message: (actions) -> actions | None
    answer  on a final answer: (Action, ActionContext) -> Action | Reject | None
    """

    name: str
    description: str
    apply: Callable[..., Any]
    stage: Stage = "reply"


CATALOG: dict[str, Repair] = {
    r.name: r
    for r in (
        Repair("boxed_answer", "accept a final answer written as \\boxed{...}", boxed_answer),
        Repair("answer_phrase", "accept 'the answer is N' / 'Final answer: N'", answer_phrase),
        Repair("last_number", "single-turn: take the last number in the reply as the answer", last_number),
        Repair("last_line", "single-turn: a short last line (at most 8 words) is the answer", last_line),
        Repair("final_answer_anywhere", "accept 'Final Answer: ...' without the action header", final_answer_anywhere),
        Repair("bare_sql", "tool tasks: run a SQL statement given without the expected action header", bare_sql),
        Repair("json_in_text", "tool calls written as JSON in the text become real calls",
               tool_calls.calls_in_text, "message"),
        Repair("coerce_types", "argument values of the wrong type are converted where lossless ('3' -> 3)",
               tool_calls.coerce_types, "call"),
        Repair("near_tool_name", "a tool name one typo away from exactly one real tool is corrected",
               tool_calls.near_tool_name, "call"),
        Repair("one_call_per_turn", "several tool calls in one message: run only the first",
               tool_calls.one_call_per_turn, "turn"),
        Repair("answer_set", "tasks with a declared answer set (labels, options): an answer outside it is mapped "
               "to the allowed answer it names, or rejected with the allowed answers",
               lambda action, ctx: answer_set(action, ctx.choices), "answer"),
        Repair("plain_number", "a final answer that is one number with thousands separators, a currency sign or "
               "a unit ('$30,000', '12 apples') becomes the plain number ('30000', '12')", plain_number, "answer"),
        Repair("error_answer", "tool tasks: a final answer that restates the error the last action returned is "
               "rejected with that error as feedback (fix the action and run it again)", error_answer, "answer"),
    )
}


def parse_repairs(text: str | None) -> list[Repair]:
    """Enabled repairs from `repairs.json` (a list of names); unknown names are an error."""
    if not text:
        return []
    names = json.loads(text)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{REPAIRS_FILE} must be a JSON list of repair names")
    unknown = [n for n in names if n not in CATALOG]
    if unknown:
        raise ValueError(f"{REPAIRS_FILE}: unknown repair(s) {unknown}; known: {sorted(CATALOG)}")
    return [CATALOG[n] for n in names]


def enabled_names(files: dict[str, str]) -> frozenset[str]:
    """The names of the repairs a harness's files enable (none when it has no `repairs.json`)."""
    return frozenset(r.name for r in parse_repairs(files.get(REPAIRS_FILE)))


def try_repairs(repairs: list[Repair], reply: str, tools: tuple[ToolSpec, ...]) -> tuple[Action, str] | None:
    """Reply-stage repairs after a rejection: the first that recovers an action wins."""
    for repair in repairs:
        if repair.stage != "reply":
            continue
        action = repair.apply(reply, tools)
        if action is not None:
            return action, repair.name
    return None


def repair_message(repairs: list[Repair], reply: Reply, tools: tuple[ToolSpec, ...]) -> tuple[Reply, str | None]:
    for repair in repairs:
        if repair.stage == "message" and (fixed := repair.apply(reply, tools)) is not None:
            return fixed, repair.name
    return reply, None


def repair_call(repairs: list[Repair], action: Action, tools: tuple[ToolSpec, ...]) -> tuple[Action, list[str]]:
    """Apply every enabled call-stage repair in order; returns the action and the repairs that changed it."""
    used: list[str] = []
    for repair in repairs:
        if repair.stage == "call" and (fixed := repair.apply(action, tools)) is not None:
            action = fixed
            used.append(repair.name)
    return action, used


def repair_turn(repairs: list[Repair], actions: list[Action]) -> tuple[list[Action], str | None]:
    for repair in repairs:
        if repair.stage == "turn" and (fixed := repair.apply(actions)) is not None:
            return fixed, repair.name
    return actions, None


def repair_answer(repairs: list[Repair], action: Action,
                  ctx: ActionContext) -> tuple[Action | Reject, str | None]:
    """Answer-stage repairs on a final answer: the first that maps or rejects it wins."""
    for repair in repairs:
        if repair.stage == "answer" and (fixed := repair.apply(action, ctx)) is not None:
            return fixed, repair.name
    return action, None
