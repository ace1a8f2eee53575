"""The built-in H2 repairs on reply shapes seen from real small models."""

from __future__ import annotations

import pytest

from ecdysis.harness.api import Action, ToolSpec
from ecdysis.harness.repairs import CATALOG, parse_repairs, try_repairs

SQL = (ToolSpec("sql", ""),)


@pytest.mark.parametrize(("reply", "expected"), [
    ("so each stall gets \\(\\boxed{192}\\).", "192"),
    ("Total: \\[ \\boxed{\\$1,250.50} \\]", "1250.50"),
    ("\\boxed{\\frac{1}{2}} then later \\boxed{18}", "18"),
])
def test_boxed_answer(reply: str, expected: str) -> None:
    assert CATALOG["boxed_answer"].apply(reply, ()) == Action("answer", expected)


def test_other_repairs() -> None:
    assert CATALOG["answer_phrase"].apply("Thus the answer is $42.", ()) == Action("answer", "42")
    assert CATALOG["last_number"].apply("3 apples and 4 pears: 7", ()) == Action("answer", "7")
    assert CATALOG["last_number"].apply("3 apples", SQL) is None  # tool tasks need an explicit answer
    assert CATALOG["final_answer_anywhere"].apply('I am sure.\nFinal Answer: ["x"]', SQL) == Action("answer", '["x"]')
    assert CATALOG["bare_sql"].apply("```sql\nSELECT 1;\n```", SQL) == Action("sql", "SELECT 1;")
    assert CATALOG["bare_sql"].apply("SELECT name FROM t;", SQL) == Action("sql", "SELECT name FROM t;")
    assert CATALOG["bare_sql"].apply("SELECT name FROM t;", ()) is None


def test_enabled_repairs_apply_in_order_and_unknown_names_fail() -> None:
    repairs = parse_repairs('["answer_phrase", "boxed_answer"]')
    assert try_repairs(repairs, "the answer is 5, i.e. \\boxed{6}", ()) == (Action("answer", "5"), "answer_phrase")
    assert try_repairs(repairs, "no numbers here", ()) is None
    with pytest.raises(ValueError, match="unknown repair"):
        parse_repairs('["guess"]')


def test_generic_short_answer_repairs() -> None:
    assert CATALOG["last_line"].apply("Let me think.\n**No.**", ()) == Action("answer", "No")
    assert CATALOG["last_line"].apply("so\nAnswer - (B)", ()) == Action("answer", "(B)")
    assert CATALOG["last_line"].apply("a long last line that has far too many words to be a short answer", ()) is None
    assert CATALOG["last_line"].apply("No.", SQL) is None  # tool tasks need an explicit answer
    assert CATALOG["answer_phrase"].apply("So the answer is True.", ()) == Action("answer", "True")


def test_error_answer_fires_only_on_an_answer_that_restates_the_last_error() -> None:
    from ecdysis.harness.api import ActionContext, answer
    from ecdysis.harness.repairs import error_answer, tool_error

    error = 'Error: near "History": syntax error'
    after_error = ActionContext((), 2, "q", last_observation=error)
    rejected = error_answer(answer('["Error: near \\"History\\": syntax error"]'), after_error)
    assert rejected is not None and rejected.rule == "error-answer" and error in rejected.feedback
    assert error_answer(answer('near "History": syntax'), after_error) is not None  # most of the error's words
    assert error_answer(answer("[42]"), after_error) is None  # a real answer after a failed attempt stands
    assert error_answer(answer("Error: whatever"), ActionContext((), 2, "q", last_observation="[(42,)]")) is None
    assert error_answer(answer("Error: x"), ActionContext((), 0, "q")) is None  # nothing ran yet
    assert tool_error("Traceback (most recent call last):\n  ...") == "Traceback (most recent call last):"
    assert tool_error("[('error', 3)]") is None  # a result that merely contains the word


@pytest.mark.parametrize(("given", "expected"), [
    ("30,000", "30000"), ("$1,200.50", "1200.50"), ("30000 bottles", "30000"), ("45%", "45"),
    ("-1,234", "-1234"), ("\u22125", "-5"), ("12 apples.", "12"), ("USD 1,000", "1000"),
    ("2,500 square feet", "2500"),
    ("30000", None), ("1.5 million", None), ("3 hours 20 minutes", None), ("twenty", None), ("1,2,3", None),
    ("10:30", None), ("The answer is 5", None), ("5 m", None), ("2 thirds", None), ("6 thousands", None),
    ("1 and a half", None), ("3x", None), ("100 BC", None), ("5 March", None), ("5 degrees below zero", None),
    ("12 months", "12"), ("10 km/h", "10"), ("1,000,000", "1000000"), ("-$5", "-5"),
])
def test_plain_number_strips_the_format_of_one_number_and_nothing_else(given: str, expected: str | None) -> None:
    from ecdysis.harness.api import ActionContext, answer

    fixed = CATALOG["plain_number"].apply(answer(given), ActionContext((), 0, "q"))
    assert fixed == (answer(expected) if expected is not None else None)


def test_plain_number_leaves_declared_answer_sets_and_tool_calls_alone() -> None:
    from ecdysis.harness.api import ActionContext, answer

    assert CATALOG["plain_number"].apply(answer("30,000"), ActionContext((), 0, "q", choices=("30,000", "1"))) is None
    assert CATALOG["plain_number"].apply(Action("sql", "30,000"), ActionContext(SQL, 0, "q")) is None
