"""H4 trajectory regulation: flag repeated statements; stop a loop of identical ones."""

from ecdysis.harness.api import StepState, Verdict


def regulate(state: StepState) -> Verdict:
    repeats = sum(1 for action, _ in state.history if action == state.action)
    if repeats >= 2:
        return Verdict(stop=True, reason="same statement repeated three times")
    if repeats == 1:
        return Verdict(annotation="(You already ran this exact statement. Answer now or try another.)")
    left = state.max_turns - state.turn - 1
    if left == 1:
        return Verdict(annotation="(One turn left: give 'Action: Answer' next.)")
    return Verdict()
