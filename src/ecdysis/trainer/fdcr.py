"""Failure-Driven Collaborative Refinement: roles debate over a shared transcript, then a Moderator
writes one harness modification spec. Prompts live in `ecdysis/prompts/*.md`.

The transcript is checkpointed in the run store after every turn, so a killed run resumes
mid-debate without repeating finished calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from string import Template
from typing import Any

from ..config import RolesSection
from ..harness.manifest import HarnessVersion
from ..harness.repairs import REPAIRS_FILE, enabled_names
from ..models.base import ChatRequest, GenerationParams, Message
from ..models.cache import MeteredModel
from ..store.db import RunStore
from .candidates import LIBRARY, CandidatePolicy
from .evidence import Pattern
from .lever_catalog import levers_text
from .levers import enabled_repairs
from .spec import (
    Change,
    HarnessSpec,
    SpecError,
    max_items,
    parse_spec,
    repair_spec,
    repair_values,
    salvage_spec,
    spec_json_schema,
)

Tried = Callable[[HarnessSpec], bool]  # True: the spec rebuilds a harness the run already validated and rejected

DEBATE_ROLES = ("analyst", "critic", "engineer")
MAX_FILE_CHARS = 1200


def render(template: str, **values: str) -> str:
    text = (resources.files("ecdysis.prompts") / f"{template}.md").read_text()
    return Template(text).safe_substitute(values)


def render_role(role: str, **values: str) -> str:
    """A role's prompt, most shared first: the common context (harness, patterns, levers, earlier rounds),
    then the discussion so far, then the role's own instruction, so every role's turn extends the previous
    turn's prefix (local KV reuse, hosted prompt caches)."""
    return f"{render('debate_context', **values).rstrip()}\n\n{render(role, **values).strip()}\n"


def harness_summary(version: HarnessVersion) -> str:
    parts = []
    for layer, label in (("contract", "H3 contract"), ("action", "H2 action realization"),
                         ("skills", "H5 skills"), ("demos", "H5 demos")):
        text = version.layer_text(layer)
        if text is not None:
            rel = getattr(version.manifest.files, layer)
            parts.append(f"[{label}: {rel}]\n{text.strip()[:MAX_FILE_CHARS]}")
    parts.append(f"[H2 repairs enabled: {REPAIRS_FILE}] {version.files.get(REPAIRS_FILE, '[]').strip()}")
    g, b = version.manifest.generation, version.manifest.budget
    parts.append(f"[settings] max_tokens={g.max_tokens} max_turns={b.max_turns} max_rejections={b.max_rejections}")
    return "\n\n".join(parts)


def _measured_text(p: Pattern) -> list[str]:
    lines = []
    if p.measured:
        lines.append("  MEASURED on the stored replies (replayed, zero model calls; enable a combination by its "
                     "whole id, e.g. repair \"a+b\"):")
        for m in p.measured:
            changed = (f", {m.changed_failing} failing episode(s) act differently (outcome needs agent runs)"
                       if m.changed_failing else "")
            passing = f", {m.changed_passing} passing episode(s) act differently" if m.changed_passing else ""
            lines.append(f"    {m.lever}: +{m.gained} task(s) of this pattern, -{m.lost} passing task(s) "
                         f"lost, {m.rescued_replies} rejected repl(ies) now accepted{changed}{passing}")
    elif p.measured is not None:
        lines.append("  MEASURED: no built-in repair gains a task of this pattern (do not propose one)")
    if p.needs_model_calls:
        lines.append(f"  NOT measurable without agent runs (each costs one evaluation of {len(p.tasks)} tasks): "
                     + "; ".join(p.needs_model_calls[:3]))
    return lines


def patterns_text(patterns: list[Pattern], max_evidence: int = 2) -> str:
    """Recurring patterns, ranked by what the harness can fix (the order the roles should follow)."""
    recurring = [p for p in patterns if p.recurring]
    lines: list[str] = []
    for p in recurring:
        fixable = p.fixable_by or ""
        lines.append(f"{p.id} ({p.layer}, {len(p.tasks)} tasks, {p.support} failures"
                     f"{', fixable by: ' + fixable if fixable else ''}): {p.name}")
        lines.append(f"  facts: {json.dumps(p.prompt_facts())}")
        if p.confusions:
            pairs = "; ".join(f"expected {c.expected!r} -> answered {c.given!r} ({c.n}x)" for c in p.confusions[:5])
            lines.append(f"  CONFUSIONS (most frequent wrong answers): {pairs}")
        if p.label_errors:
            worst = sorted(p.label_errors.items(), key=lambda kv: -kv[1].errors)[:6]
            lines.append("  errors per expected answer: " + ", ".join(
                f"{label} {v.errors}/{v.tasks}" for label, v in worst))
        lines.extend(_measured_text(p))
        lines.append(f"  other levers: {'; '.join(p.levers)}")
        for ev in p.evidence[:max_evidence]:
            reply = ev.last_reply[-300:].replace("\n", " ")
            lines.append(f"  example: reply ends '...{reply}' | parsed answer={ev.final_answer!r} | {ev.detail}")
    isolated = [p for p in patterns if not p.recurring]
    if isolated:
        lines.append(f"(+{len(isolated)} isolated patterns, {sum(p.support for p in isolated)} failures: "
                     "likely model-specific, do not patch them)")
    return "\n".join(lines) or "(none)"


def ignored_verified_lever(spec: HarnessSpec, patterns: list[Pattern]) -> str | None:
    """The reason to send a spec back once: it leaves out a measured zero-loss lever of a recurring
    pattern without naming that pattern in any rationale."""
    enabled = enabled_repairs(spec)
    said = " ".join(c.rationale for c in spec.changes) + " " + spec.implementation_notes
    for p in patterns:
        best = p.verified_lever() if p.recurring else None
        if best is None:
            continue
        if not set(best.repairs) & enabled and not re.search(rf"\b{p.id}\b", said):
            return (f"{p.id} has a measured lever that gains {best.gained} task(s) and loses none "
                    f"({best.lever}); include it, or say in a rationale why {p.id} should not get it")
    return None


REPLAY_NO_GAIN = "replayed on the stored replies, it gains no task of any pattern"


def gainless_repairs(spec: HarnessSpec, patterns: list[Pattern]) -> list[Change]:
    """The spec's enable_repair changes whose replay gained nothing for any pattern ([] if nothing was measured)."""
    useful = measured_repairs(patterns)
    return [] if useful is None else [c for c in spec.changes if c.kind == "enable_repair"
                                      and not set(c.repair.split("+")) <= useful]


def repairs_without_gain(spec: HarnessSpec, patterns: list[Pattern]) -> str | None:
    """The reason to send a spec back once: it enables a repair whose replay gained nothing for any pattern."""
    useless = gainless_repairs(spec, patterns)
    if not useless:
        return None
    useful = measured_repairs(patterns) or set()
    with_gains = f" (measured levers with gains: {', '.join(sorted(useful))})" if useful else ""
    return f"enable_repair {', '.join(c.repair for c in useless)}: {REPLAY_NO_GAIN}; drop it{with_gains}"


def measured_repairs(patterns: list[Pattern]) -> set[str] | None:
    """The repairs some measured lever of the patterns holds; None when nothing was measured."""
    if all(p.measured is None for p in patterns):
        return None
    return {name for p in patterns for m in p.measured or [] for name in m.repairs}


def not_offered(combinations: tuple[str, ...], enabled: frozenset[str], patterns: list[Pattern],
                tried: Callable[[str], bool]) -> frozenset[str]:
    """The repair values the writer's grammar leaves out besides those the harness has: when the patterns were
    measured, every repair no measured lever holds (its replay gained nothing: `repairs_without_gain` would
    send it back), and every repair `tried` says the run already rejected."""
    useful = measured_repairs(patterns)
    return frozenset(r for r in repair_values(combinations) if not set(r.split("+")) <= enabled and (
        (useful is not None and not set(r.split("+")) <= useful) or tried(r)))


def library_spec(patterns: list[Pattern]) -> HarnessSpec | None:
    """When no valid spec came out of the roles: an empty spec for the first recurring pattern with a
    measured zero-loss lever (which `with_verified_levers` then fills in), else None."""
    target = next((p for p in patterns if p.recurring and p.verified_lever()), None)
    if target is None:
        return None
    return HarnessSpec.model_construct(patterns_addressed=[target.id], changes=[], skills=[],
                                       implementation_notes="written by the library from measured levers",
                                       expected_effect="the measured gain of the lever")


def with_verified_levers(spec: HarnessSpec, patterns: list[Pattern]) -> tuple[HarnessSpec, list[str]]:
    """After the send-back, a spec that still ignores a measured zero-loss lever without saying why gets
    it added by the library (replacing the last change if the spec is full); acceptance still decides."""
    added: list[str] = []
    limit = max_items("changes")
    seen: set[str] = set()  # every spec reached: a repeat is a cycle, which would never end
    while (reason := ignored_verified_lever(spec, patterns)) is not None:
        p = next(p for p in patterns if reason.startswith(p.id + " "))
        best = p.verified_lever()
        assert best is not None
        names = best.repairs  # the whole measured combination, exactly as measured
        change = Change(layer="H2", kind="enable_repair", repair="+".join(names), text="",
                        rationale=f"{p.id}: added by the library, measured on the stored replies "
                                  f"(+{best.gained} task(s), 0 lost)")
        changes = [*spec.changes, change] if len(spec.changes) < limit else [*spec.changes[:-1], change]
        spec = spec.model_copy(update={"changes": changes,
                                       "patterns_addressed": sorted({*spec.patterns_addressed, p.id})})
        # a full spec whose last slot two patterns' levers take in turn (each leaves the other ignored) repeats
        state = spec.model_dump_json()
        if state in seen:
            added.append(f"stopped: {limit} changes leave no room for every measured lever")
            break
        seen.add(state)
        added.append(f"enable_repair {'+'.join(names)} for {p.id}")
    return spec, added


@dataclass
class DebateOutcome:
    spec: HarnessSpec | None
    transcript: list[dict[str, Any]]
    error: str = ""
    raw: list[str] = field(default_factory=list)
    source: str = "roles"  # "library: ..." when the roles wrote no usable spec and the library wrote this one
    stopped: str = ""  # the budget's stop reason when the budget stopped the roles (then no spec)


class BudgetSpent(Exception):
    """The budget is spent: a role call the run has not paid for yet is not made."""


def unlimited() -> str | None:
    """A budget that is never spent (the default of the roles' `spent`)."""
    return None


def check_budget(spent: Callable[[], str | None], paid: Callable[[str], bool], model: MeteredModel,
                 request: ChatRequest) -> None:
    """BudgetSpent when the budget is spent (`spent` says why) and the run has not paid for this request yet;
    a request it already paid for is free and always made (a resumed run decides as the uninterrupted one)."""
    if (stop := spent()) is not None and not paid(model.request_key(request)):
        raise BudgetSpent(stop)


@dataclass
class SpecWriter:
    """Runs the debate (or a single analyst) and the Moderator, checkpointing every turn. `spent` is the
    budget's stop reason (None while money is left): checked before every role call, so an arm makes no new
    call once its budget is spent (as an evaluation starts no new episode), whatever its number of roles. A
    request the run already paid for is free and always made: a resumed run replays its calls from the cache
    and decides as the uninterrupted run did, though their cost is already in the spend."""

    store: RunStore
    run_id: str
    roles: dict[str, MeteredModel]
    settings: RolesSection = field(default_factory=RolesSection)
    spent: Callable[[], str | None] = unlimited
    # the method's candidate policy: without `measured_lever` no verified lever is added to a spec and no spec is
    # sent back for leaving one out; without `fallback` no library spec stands in when the roles write none
    # (`serial` as published gets neither)
    policy: CandidatePolicy = LIBRARY

    async def _say(self, role: str, prompt: str, schema: dict[str, Any] | None = None,
                   history: list[Message] | None = None) -> tuple[str, str]:
        """One role turn; returns (text, finish reason)."""
        messages = [*(history or []), Message(role="user", content=prompt)]
        limit = self.settings.spec_max_tokens if schema else self.settings.max_tokens
        params = GenerationParams(temperature=self.settings.temperature, max_tokens=limit, json_schema=schema)
        request, model = ChatRequest(messages=messages, params=params), self.roles[role]
        check_budget(self.spent, lambda key: self.store.paid_role_call(self.run_id, key), model, request)
        response = await model.chat(request)
        return response.text, response.finish_reason

    def _with_levers(self, spec: HarnessSpec, patterns: list[Pattern]) -> tuple[HarnessSpec, list[str]]:
        """`with_verified_levers` when the method's policy takes the library's measured levers, else the spec."""
        return with_verified_levers(spec, patterns) if self.policy.measured_lever else (spec, [])

    def _checkpoint(self, key: str, transcript: list[dict[str, Any]]) -> None:
        self.store.put_record(self.run_id, "transcript", key, transcript)

    async def write(self, key: str, harness: HarnessVersion, patterns: list[Pattern], passes: int,
                    debate: bool = True, earlier: str = "", tried: Tried | None = None) -> DebateOutcome:
        """Debate for `passes` rounds (if `debate`), then have the Moderator (or analyst) write the spec.

        `earlier` describes specs tried in earlier rounds and why they were rejected. A repair whose spec
        `tried` says rebuilds a harness the run already rejected is not offered. (Sending such specs back was
        measured and dropped: on designed seed 2 the 1.5B writer returned the same spec 13 times of 13, at one
        more call a round; docs/claim.md.) A reply refused only for the wording of its rules or tips gets no
        repair call unless `roles.repair_wording`: its valid changes are kept (`salvage_spec`; not a repair whose
        replay gained nothing), else the library's
        measured spec (when the policy's `fallback`), else none (replayed on the designed suite, the 1.5B
        writers' repairs failed the same wording check in 141 of 147 rounds, a writer call each).
        """
        tried = tried or (lambda spec: False)
        transcript: list[dict[str, Any]] = self.store.get_record(self.run_id, "transcript", key) or []
        context = {"harness": harness_summary(harness), "patterns": patterns_text(patterns), "levers": levers_text(),
                   "earlier": earlier or "(first attempt)"}
        turns = [(p, r) for p in range(passes) for r in DEBATE_ROLES] if debate else []
        for index, (pass_no, role) in enumerate(turns):
            if index < len(transcript):
                continue  # done before a restart
            said = "\n".join(f"{t['role'].upper()}: {t['text']}" for t in transcript) or "(nothing yet)"
            try:
                text, _ = await self._say(role, render_role(role, transcript=said, **context))
            except BudgetSpent as spent:
                return DebateOutcome(None, transcript, error=f"no spec: {spent} during the debate",
                                     stopped=str(spent))
            transcript.append({"pass": pass_no, "role": role, "text": text.strip()})
            self._checkpoint(key, transcript)
        # a run killed after the writer's entry was checkpointed but before its spec was stored writes the
        # spec again (its calls are cache hits): drop that entry so the transcript holds it once
        del transcript[len(turns):]
        said = "\n".join(f"{t['role'].upper()}: {t['text']}" for t in transcript)
        writer = "moderator" if debate else "analyst"
        prompt = render_role("moderator" if debate else "single_analyst", transcript=said or "(none)", **context)
        ids = {p.id for p in patterns if p.recurring}
        raw: list[str] = []
        history: list[Message] = []
        error = ""
        combinations = tuple(sorted({"+".join(m.repairs) for p in patterns for m in p.measured or []}))
        enabled = enabled_names(harness.files)
        schema = spec_json_schema(combinations, enabled, not_offered(combinations, enabled, patterns,
                                                                     lambda r: tried(repair_spec(r, sorted(ids)))))
        for attempt in range(2):  # the spec, then one repair with the error shown
            try:
                text, finish = await self._say(writer, prompt, schema=schema,
                                               history=history)
            except BudgetSpent as spent:
                return DebateOutcome(None, transcript, error=f"no spec: {spent} before the {writer}'s "
                                     f"{'repair' if attempt else 'spec'}", raw=raw, stopped=str(spent))
            raw.append(text)
            try:
                spec = parse_spec(text, harness, ids)
                if attempt == 0 and (ignored := self.policy.measured_lever and ignored_verified_lever(spec, patterns)
                                     or repairs_without_gain(spec, patterns)):
                    raise SpecError(ignored)
            except SpecError as exc:
                error = str(exc)
                if finish == "length":
                    error = "the JSON was cut off at the length limit; write fewer, shorter strings. " + error
                if exc.wording_only and not self.settings.repair_wording:
                    break  # no repair call (`roles.repair_wording`): keep the reply's valid changes, below
                history = [*history, Message(role="user", content=prompt), Message(role="assistant", content=text)]
                prompt = render("repair_spec", error=error)
                continue
            spec, added = self._with_levers(spec, patterns)
            transcript.append({"pass": passes, "role": writer, "text": text, **({"added": added} if added else {})})
            self._checkpoint(key, transcript)
            return DebateOutcome(spec, transcript, raw=raw)
        salvaged = salvage_spec(raw[-1], harness, ids)
        if salvaged is not None:  # a writer that ignores the grammar can still name a gainless repair: drop it too
            spec, dropped = salvaged
            gainless = gainless_repairs(spec, patterns)
            spec = spec.model_copy(update={"changes": [c for c in spec.changes if c not in gainless]})
            dropped = dropped + [f"enable_repair {c.repair}: {REPLAY_NO_GAIN}" for c in gainless]
        if salvaged is not None and spec.changes:
            spec, added = self._with_levers(spec, patterns)
            transcript.append({"pass": passes, "role": writer, "text": raw[-1], "dropped": dropped,
                               **({"added": added} if added else {})})
            self._checkpoint(key, transcript)
            return DebateOutcome(spec, transcript, raw=raw)
        library = library_spec(patterns) if self.policy.fallback else None
        if library is not None:  # the roles wrote no usable spec, but the evidence measured a fix
            spec, added = self._with_levers(library, patterns)
            transcript.append({"pass": passes, "role": writer, "text": raw[-1], "error": error,
                               "library_spec": added})
            self._checkpoint(key, transcript)
            return DebateOutcome(spec, transcript, raw=raw,
                                 source=f"library: {', '.join(added) or spec.summary()}; the roles wrote no "
                                        "usable spec")
        transcript.append({"pass": passes, "role": writer, "text": raw[-1], "error": error})
        self._checkpoint(key, transcript)
        after = "after repair" if len(raw) > 1 else "(its wording; no repair asked)"
        return DebateOutcome(None, transcript, error=f"spec rejected {after}: {error}", raw=raw)
