"""The seed evaluation one compare seed's training arms share: run once, charged to every arm.

Every engine arm starts by evaluating the seed harness on the train and val tasks. Within one compare seed
that is the same work (same tasks, model and harness), so it runs once, under a run and a cache scope of its
own (`SharedSeed`); each arm reads its episodes (the evaluator routes the seed harness to this runner),
charges them to its own budget and curve, and also reads that cache scope on a miss of its own, so a
variant that asks what the seed asked is served from it. Every arm's curve so starts at the same charged cost.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..runner.runner import Runner
from ..workspace import Workspace


@dataclass(frozen=True)
class SharedSeed:
    """The shared seed evaluation's run id and cache scope (`compare` makes one per seed and config)."""

    run_id: str
    scope: str

    @classmethod
    def for_seed(cls, seed: int, config_key: str) -> SharedSeed:
        return cls(f"seed-eval-seed{seed}-{config_key}", f"seed-eval/seed{seed}/{config_key}")

    def runner(self, ws: Workspace) -> Runner:
        """The runner the seed harness is evaluated with (its run is opened, or reopened, in the store)."""
        ws.store.start_run("seed-eval", {"scope": self.scope}, run_id=self.run_id)
        return ws.runner(self.run_id, cache_scope=self.scope)

    def reading(self, runner: Runner) -> Runner:
        """`runner` with its agent (and user) model also reading this scope on a miss of its own."""
        user = runner.user_model
        return replace(runner, model=replace(runner.model, read_scopes=(self.scope,)),
                       user_model=replace(user, read_scopes=(self.scope,)) if user is not None else None)
