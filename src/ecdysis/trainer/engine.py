"""The training engine, written once for every method: collect -> propose -> implement -> check -> validate -> accept.

A method (methods.py) is a schedule (schedules.py: which steps a round takes), a proposer (proposers/: the
spec of one step, from a narrow context), a candidate policy (candidates.py: the library's measured levers,
variants and fallbacks) and the shared acceptance rule and budget (`[train.budget]`); the loop is this one.

A step: the proposer's spec (stored), the candidate and its variants built and checked (stored), the variant
picked on the training tasks (cache-served; `train.engine.screen_batch` screens on a few tasks first), the
pick validated on the acceptance split against the current harness on the same task ids, and decided by the
acceptance rule (accept.py). With `train.engine.early_stop` the candidate runs in batches and the rule may decide
between them (strict/tolerance: once the rejection is certain; sequential: accept or reject at its stated error
rate). Under the sequential rule a change that only edits H2 is decided on its exact replay instead (exact.py).
Every decision stores its evidence (`DecisionEvidence`) with the step's record. After every
decision a `CurvePoint` is stored. Every step is timed and stored, so a rerun resumes without repeating work.
Time is charged time (charged.py), checked before every episode starts; in a compare the seed harness is
evaluated once per seed for every arm (shared_seed.py) and charged to each.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..agent.trajectory import INFRA_ERROR, Trajectory
from ..config import Config
from ..harness.manifest import HarnessVersion
from ..workspace import Workspace
from . import records
from .accept import Decision, make_rule
from .budget import Budget, Spend, optimizer_spend
from .charged import charged_seconds
from .checks import CheckFailed, check_static
from .context import TrainContext
from .evaluation import Evaluator, Measured
from .exact import Replays, decide_on_replays, decide_train_exact, first_loss
from .failures import Pattern
from .fdcr import SpecWriter, Tried
from .history import StepHistory
from .implement import Candidate, apply_structured
from .lever_catalog import LEVERS, edits_only_h2
from .levers import candidate_variants, library_fallback_specs
from .methods import Method
from .proposers import Evidence, Proposal, ProposerContext
from .records import CandidateRecord, CurvePoint, RoundRecord, SpecRecord
from .rerun import runner_rerun
from .schedules import StepOutcome
from .shared_seed import SharedSeed
from .spec import HarnessSpec
from .view import TrainView

WHOLE = "whole spec"


def changes_nothing(current: HarnessVersion, built: Candidate) -> bool:
    """A candidate that edits only H2 (repairs, the action file) and whose replay changes no training episode:
    on the evidence it acts exactly like the current harness."""
    if built.version is None or built.replay is None:
        return False
    r = built.replay
    return edits_only_h2(current, built.version.files) and not (
        r.gained or r.lost or r.changed or r.changed_passing or r.rescued)


class Engine(TrainContext):
    """One training run of one arm: `train(seed)` returns (final harness, round records, stop reason)."""

    def __init__(self, ws: Workspace, run_id: str, method: Method, config: Config | None = None,
                 view: TrainView | None = None, shared_seed: SharedSeed | None = None) -> None:
        super().__init__(ws, run_id, method.name, config, view, shared_seed)
        if method.schedule is None or method.proposer is None:
            raise ValueError(f"{method.name!r} does not run the training loop")
        self.method, self.schedule, self.proposer = method, method.schedule, method.proposer()
        self.history = StepHistory(self.store, run_id)
        t, e = self.cfg.train, self.cfg.train.engine
        self.budget = Budget(t.budget.agent_executions, t.budget.optimizer_tokens, t.budget.wall_s)
        self.rule = make_rule(t)
        batches = {self.accept_split: e.eval_batch or 4 * self.cfg.run.concurrency} if e.early_stop else {}
        if e.screen_batch:
            batches["train"] = e.screen_batch
        val = self.val_tasks or (self.ws.tasks("val", t.val_limit) if t.accept_on == "train" else [])
        self.evaluator = Evaluator(self.store, run_id, self.runner, {"train": self.train_tasks, "val": val},
                                   t.train_trials, batches, self.budget, self.spend)
        writer = SpecWriter(self.store, run_id, self.roles, self.cfg.roles, spent=self.evaluator.spent,
                            policy=self.method.candidates)
        self.proposer_context = ProposerContext(writer, self.cfg, self.train_tasks, self.history, self.no_new_try)

    # accounting -------------------------------------------------------------------------------------------
    def spend(self) -> Spend:
        """What the run has spent so far (agent episodes from the registered evaluations, optimizer calls
        from the store, charged seconds from both (trainer/charged.py), real wall time from the timed steps)."""
        run, cached = self.evaluator.executions()
        optimizer = optimizer_spend(self.store, self.run_id)
        charged = charged_seconds(self.store, self.run_id, list(self.evaluator.ledger), run + cached, self.replays())
        return Spend(run, cached, optimizer.calls, optimizer.tokens, self.wall_s(), charged)

    def score(self, version: HarnessVersion, split: str) -> float | None:
        """The harness's stored score on a split, when that evaluation is complete (never a made-up 0)."""
        if not self.evaluator.tasks[split]:
            return None
        measured = self.evaluator.lookup(version, split)
        return measured.score if measured.complete else None

    def point(self, decision_key: str, current: HarnessVersion, accepted: bool, taken: bool = True) -> None:
        """Store the curve point of one decision (once: a resumed run does not store it again)."""
        if self.store.get_record(self.run_id, "curve-of", decision_key) is not None:
            return
        step, s = self.store.count_records(self.run_id, "curve"), self.spend()
        records.put(self.store, self.run_id, f"curve/{step:04d}", CurvePoint(
            arm=self.arm, step=step, harness_id=current.id, val_score=self.score(current, "val"),
            train_score=self.score(current, "train"), wall_s=s.wall_s, agent_executions=s.agent_executions,
            cached_executions=s.cached_executions, optimizer_calls=s.optimizer_calls,
            optimizer_tokens=s.optimizer_tokens, accepted=accepted, charged_s=s.charged_s, taken=taken))
        self.store.put_record(self.run_id, "curve-of", decision_key, step)

    def started(self, key: str) -> bool:
        """Whether a round or step was started (a resumed run finishes it as the uninterrupted run would: the
        budget is checked inside it, and what it already paid for is free)."""
        return self.store.get_record(self.run_id, "started", key) is not None

    def start(self, key: str) -> None:
        self.store.put_record(self.run_id, "started", key, True)

    def curve(self) -> list[CurvePoint]:
        return sorted((p for _, p in records.load_all(self.store, self.run_id, CurvePoint)), key=lambda p: p.step)

    # the loop ---------------------------------------------------------------------------------------------
    async def train(self, seed: HarnessVersion) -> tuple[HarnessVersion, list[RoundRecord], str]:
        self.store.save_version(seed, note="seed")
        if self.seed_runner is not None:  # a compare seed's arms evaluate the seed once (shared_seed.py)
            self.evaluator.shared[seed.id] = self.seed_runner
        if self.store.get_record(self.run_id, "curve-of", "seed") is None:
            await self.collect("r1", 1, seed)
            if self.val_tasks:
                await self._timed("r1/val-base", lambda: self.evaluator.measure(seed, "val"))
            self.point("seed", seed, accepted=False)
        if self.shared_seed is not None:  # its run was (re)opened for this arm: nothing more runs in it
            self.store.finish_run(self.shared_seed.run_id, {"seed_harness": seed.id})
        current, rounds, rejected, stop = seed, [], 0, "round limit reached"
        limit = self.cfg.train.engine.stop_after_rejections
        for r in range(1, self.cfg.train.rounds + 1):
            record = records.load(self.store, self.run_id, RoundRecord, f"r{r}")
            if record is None:
                if not self.started(f"r{r}") and (spent := self.evaluator.spent()) is not None:
                    stop = spent
                    break
                self.start(f"r{r}")
                record = await self.schedule.round(self, r, current)
                records.put(self.store, self.run_id, f"r{r}", record)
            rounds.append(record)
            current = self.store.load_version(record.harness_after)
            if record.stop is not None:
                stop = record.stop
                break
            rejected = 0 if record.accepted else rejected + 1
            if self.schedule.stops_after_rejections and limit and rejected >= limit:
                stop = (f"no edit accepted in {limit} rounds in a row "
                        f"(train.engine.stop_after_rejections = {limit})")
                break
        return current, rounds, stop

    async def collect(self, key: str, r: int, current: HarnessVersion) -> Evidence:
        """The current harness on the training tasks, its trajectories and grounded patterns."""
        measured = await self._timed(f"{key}/collect", lambda: self.evaluator.measure(current, "train"))
        trajectories = [t for e in measured.eval_ids for t in self.store.trajectories(e)
                        if t.termination != INFRA_ERROR]
        patterns, measurements = await self.grounded_patterns(key, current, trajectories)
        return Evidence(key, r, current, measured, trajectories, patterns, measurements)

    # one step ---------------------------------------------------------------------------------------------
    async def attempt(self, key: str, ev: Evidence, target: str | None) -> StepOutcome:
        """Propose, implement and check, pick the variant, validate and decide (each part stored under `key`)."""
        spec_record = records.load(self.store, self.run_id, SpecRecord, key)
        if spec_record is None:
            proposal = await self._timed(f"{key}/spec", lambda: self.propose(ev, key, target))
            spec_record = SpecRecord(spec=proposal.spec.model_dump() if proposal.spec else None,
                                     error=proposal.error, source=proposal.source, stopped=proposal.stopped)
            records.put(self.store, self.run_id, key, spec_record)
        spec = HarnessSpec.model_validate(spec_record.spec) if spec_record.spec is not None else None
        if spec is None and spec_record.stopped:  # the budget stopped the roles: nothing to build or decide
            return StepOutcome(reason=spec_record.error or f"no spec: {spec_record.stopped}", taken=False)
        if spec is not None:
            self.view.spec(spec, spec_record.source)
        candidate, versions = await self.candidates(key, ev, spec, spec_record.source, target)
        out = StepOutcome(tried=spec.summary() if spec else None,
                          library=candidate.source.removeprefix("library: ") if candidate.source != "roles" else None)
        replaced = candidate.source != spec_record.source  # the library's fallback, not the spec, was built
        if replaced and versions:
            self.view.note(f"the {'spec above' if spec else 'roles'} gave no new candidate that runs; validating "
                           f"the library's {out.library} instead")
        if not versions and candidate.stopped:  # the budget stopped the implementer: nothing to decide
            return StepOutcome(tried=out.tried, reason=f"no candidate: {candidate.error}", taken=False)
        if not versions:
            out.reason = (f"nothing new to try: the candidate {candidate.harness} and its variants were already "
                          "validated and rejected in this run" if candidate.harness
                          else f"no candidate passed the checks: {candidate.error}" if spec or candidate.error
                          else spec_record.error or "no valid spec")
            return out
        out.variant, chosen, out.variant_scores = await self.pick(key, versions)
        decision, measured = await self.validate(key, ev.current, chosen, ev.trajectories)
        out.accepted, out.reason, out.taken = decision.accepted, decision.reason, decision.taken
        out.early = decision.early
        out.candidate, out.decided_on = chosen.id, measured.split
        out.candidate_score = measured.score if measured.per_task else decision.candidate  # nothing ran: replayed
        if decision.evidence is not None:
            out.evidence = decision.evidence.model_copy(update={"current": ev.current.id, "candidate": chosen.id})
        if len(versions) > 1:
            out.reason = f"{out.variant} (picked on train): {out.reason}"
        what = f"the library's {out.library}" if replaced else out.variant
        target_note = f"serial edit for {target}, " if target else ""  # per-failure schedules name their target
        self.view.decision(out.accepted, f"{target_note}{what}: {out.reason}")
        return out

    async def propose(self, ev: Evidence, key: str, target: str | None) -> Proposal:
        """The candidate policy's measured lever when it covers the step's patterns (no role call), else the
        proposer's spec. A lever whose harness this run already validated and rejected (as its spec, or a harness
        it rebuilds, e.g. a variant of a roles spec) goes to the proposer instead, known before any call."""
        patterns = self.proposer.patterns(self.proposer_context, ev, target)
        taken = self.method.candidates.measured_spec(self.cfg, patterns, self.history.rejected_specs(ev.round))
        if taken is not None and not self.rebuilds_rejected(taken[0], ev):
            spec, lever = taken
            return Proposal(spec, patterns, source=f"library: {lever.lever} covers every recurring pattern; "
                            "no role asked", target=target)
        return await self.proposer.propose(self.proposer_context, ev, key, target)

    def no_new_try(self, ev: Evidence) -> Tried:
        """Whether a spec written on `ev` rebuilds a harness this run already validated and rejected (the
        writer's grammar does not offer such a repair)."""
        return lambda spec: self.rebuilds_rejected(spec, ev)

    def rebuilds_rejected(self, spec: HarnessSpec, ev: Evidence) -> bool:
        """True when a spec the catalog applies itself (no code for the implementer to write) builds a harness
        this run already validated and rejected: known from the spec alone (no model call, no replay)."""
        rejected = self.history.rejected_candidates()
        if not rejected or any(not LEVERS[c.kind].apply for c in spec.changes) or self.cfg.train.implementer_command:
            return False
        files, _ = apply_structured(ev.current, spec, ev.trajectories, {t.id: t for t in self.train_tasks})
        try:
            version = check_static(ev.current, files, self.train_tasks)
        except (CheckFailed, ValueError, KeyError):
            return False
        return version.id in rejected

    async def candidates(self, key: str, ev: Evidence, spec: HarnessSpec | None, source: str,
                         target: str | None = None) -> tuple[CandidateRecord, dict[str, HarnessVersion]]:
        """The whole spec's candidate (or the library's fallback when the roles gave nothing that runs) and its
        variants, built and checked once (stored as the step's candidate record)."""
        stored = records.load(self.store, self.run_id, CandidateRecord, key)
        if stored is None:
            patterns = self.proposer.patterns(self.proposer_context, ev, target)
            stored = await self._build(key, ev, spec, source, patterns)
            records.put(self.store, self.run_id, key, stored)
        versions = {WHOLE: self.store.load_version(stored.harness)} if stored.harness else {}
        versions |= {n: self.store.load_version(h) for n, h in stored.variants.items()}
        rejected = self.history.rejected_candidates()  # a harness already decided is never picked or validated again
        return stored, {n: v for n, v in versions.items() if v.id not in rejected}

    async def _build(self, key: str, ev: Evidence, spec: HarnessSpec | None, source: str,
                     patterns: list[Pattern]) -> CandidateRecord:
        implementer, current = self.implementer(), ev.current
        implementer.spent = self.evaluator.spent
        implementer.paid = lambda request_key: self.store.paid_role_call(self.run_id, request_key)

        async def build(s: HarnessSpec, what: str):  # noqa: ANN202 - implement.Candidate
            return await self._timed(f"{key}/{what}", lambda: implementer.build(current, s, ev.trajectories))

        built = await build(spec, "implement") if spec is not None else None
        if built is not None and built.stopped:  # the budget stopped the implementer: the step is cut
            return CandidateRecord(error=built.error, attempts=built.attempts, source=source, stopped=built.stopped)
        used, rejected = spec, self.history.rejected_candidates()
        weak = built is not None and built.version is not None and (
            built.version.id in rejected or changes_nothing(current, built))
        if (built is None or built.version is None or weak) and self.method.candidates.fallback:
            for fallback in library_fallback_specs(patterns):  # no new try: a rejected harness, or a no-op
                if self.rebuilds_rejected(fallback, ev):  # known without building (and replaying) it
                    continue
                attempt = await build(fallback, "implement")  # the library's levers: no implementer call
                if attempt.version is not None and attempt.version.id not in rejected:
                    built, used = attempt, fallback
                    source = f"library: {fallback.changes[0].kind}"
                    break
        if built is None:
            return CandidateRecord(source=source)
        record = CandidateRecord(harness=built.version.id if built.version else None, applied=built.applied,
                                 attempts=built.attempts, error=built.error or None,
                                 replay=built.replay.to_dict() if built.replay else None, source=source)
        if built.version is None or used is None:
            return record
        self.store.save_version(built.version, parent=current.id, note=f"{self.arm} {key}")
        if self.ws.cache is None:  # variants are picked on train from the response cache
            return record
        for name, variant_spec in candidate_variants(used, patterns):
            if not self.method.candidates.variants and not all(c in used.changes for c in variant_spec.changes):
                continue  # a baseline validates only parts of its own spec
            sub = await build(variant_spec, "variants")
            seen = {current.id, built.version.id, *record.variants.values(), *rejected}
            if sub.version is not None and sub.version.id not in seen:
                self.store.save_version(sub.version, parent=current.id, note=f"{self.arm} {key} {name}")
                record.variants[name] = sub.version.id
        return record

    async def pick(self, key: str, versions: dict[str, HarnessVersion]
                   ) -> tuple[str, HarnessVersion, dict[str, float | None]]:
        """The variant to validate, picked on the training tasks (never on the split it is decided on, unless
        edits are decided on train). Ties go to the later variant: variants are the spec's smaller parts."""
        names = list(versions)
        if len(names) == 1:
            return names[0], versions[names[0]], {}
        order = {n: i for i, n in enumerate(names)}
        if self.cfg.train.engine.screen_batch and len(names) > 2:
            screened = {n: await self._timed(f"{key}/screen", lambda n=n: self.evaluator.measure(
                versions[n], "train", max_batches=1)) for n in names}
            names = sorted(names, key=lambda n: (screened[n].score or 0.0, order[n]), reverse=True)
            names = names[:math.ceil(len(names) / 2)]
        scores = {n: (await self._timed(f"{key}/pick", lambda n=n: self.evaluator.measure(versions[n], "train"))).score
                  for n in names}
        best = max(names, key=lambda n: (scores[n] if scores[n] is not None else -1.0, order[n]))
        return best, versions[best], scores

    async def validate(self, key: str, current: HarnessVersion, chosen: HarnessVersion,
                       trajectories: list[Trajectory]) -> tuple[Decision, Measured]:
        """The current harness and the candidate on the acceptance split, decided by the rule on the same task ids.
        With `train.engine.early_stop` the candidate runs in batches and the rule may decide between them. A rule
        that pools exact evidence decides an H2-only candidate on its replays (`trajectories`: the current
        harness's training episodes) when every changed episode replays exactly; an accepted one is then evaluated
        on the split (it is the next decision's base; cache-served where replies are cached)."""
        split, trials = self.accept_split, self.cfg.train.train_trials
        base = await self._timed(f"{key}/val-base" if split == "val" else f"{key}/base",
                                 lambda: self.evaluator.measure(current, split))
        h2_only = chosen.id != current.id and edits_only_h2(current, chosen.files)
        if self.rule.pools_exact_evidence and base.complete and h2_only:
            held = [t for e in base.eval_ids for t in self.store.trajectories(e)] if split == "val" else None
            replayed = await self._timed(f"{key}/exact", lambda: decide_on_replays(
                self.rule, chosen, Replays(self.ws.env, self.runner.limits, runner_rerun(self.runner)),
                (trajectories, self.train_tasks), (held, self.evaluator.tasks["val"]), base.score or 0.0))
            decided = replayed.decision
            if decided is not None:
                cand = Measured(chosen.id, split, base.expected, trials)
                if decided.accepted:  # now the current harness: its evaluation is the next decision's base
                    cand = await self._timed(f"{key}/validate", lambda: self.evaluator.measure(chosen, split))
                return decided, cand
            if split == "val" and replayed.train is not None and replayed.exact_train_gain():
                # the training gain is exact; val replays are not: val runs settle it (stop at the first loss)
                stop_at_loss = first_loss(base.per_task) if self.cfg.train.engine.early_stop else None
                cand = await self._timed(f"{key}/validate", lambda: self.evaluator.measure(chosen, split,
                                                                                           stop_at_loss))
                return decide_train_exact(self.rule.name, replayed.train, base.per_task, cand.per_task,
                                          base.expected, split, getattr(self.rule, "alpha", None)), cand
        early = self.cfg.train.engine.early_stop and base.complete
        validation = self.rule.start(base.per_task, base.expected, split,
                                     self.evaluator.batches.get(split) if early else None, trials)

        def stop(partial: dict[str, list[float]]) -> str | None:
            d = validation.interim(partial)
            return d.reason if d else None

        cand = await self._timed(f"{key}/validate", lambda: self.evaluator.measure(chosen, split,
                                                                                   stop if early else None))
        decision = validation.conclude(cand.per_task)
        if not decision.taken:
            why = "; ".join(m.stopped for m in (base, cand) if m.stopped)
            decision = replace(decision, reason=f"{decision.reason}{f' ({why})' if why else ''}")
        return decision, cand

    async def val_scores(self, seed: HarnessVersion, final: HarnessVersion) -> tuple[float | None, float | None]:
        """Val accuracy of the seed and the final harness (read back when training already ran them; not
        charged to the training budget)."""
        if not self.evaluator.tasks["val"]:
            return None, None
        before = await self._timed("val/seed", lambda: self.evaluator.measure(seed, "val", charge=False))
        after = await self._timed("val/final", lambda: self.evaluator.measure(final, "val", charge=False))
        return before.score, after.score
