"""H4 trajectory regulation: single-turn tasks need none."""

from ecdysis.harness.api import StepState, Verdict


def regulate(state: StepState) -> Verdict:
    return Verdict()
