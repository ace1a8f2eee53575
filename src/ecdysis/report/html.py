"""`ecdysis report`: one self-contained HTML file (inline CSS, SVG plots, no network) from the run store, of a
training run or (evaluation.py) of any other run's evaluations."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, PackageLoader
from markupsafe import Markup, escape

from ..compare.files import arm_result
from ..compare.table import column_label, compare_sections
from ..store.db import RunStore
from .data import (
    VersionNode,
    compare_arms,
    compare_curves,
    fmt,
    load_run,
    summary_card,
    training_runs,
    trajectory_anchor,
)
from .plots import all_plots


def diff_lines(diff: str) -> list[tuple[str, str]]:
    """Each line of a unified diff with its CSS class (file header, hunk, added, deleted, context)."""
    out = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            cls = "file"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        out.append((cls, line))
    return out


def lineage_html(nodes: list[VersionNode]) -> Markup:
    """The version tree as nested lists (parents before children)."""
    children: dict[str | None, list[VersionNode]] = {}
    known = {n.id for n in nodes}
    for n in nodes:
        children.setdefault(n.parent if n.parent in known else None, []).append(n)

    def tree(parent: str | None) -> str:
        items = []
        for n in children.get(parent, []):
            label = (f'<code>{escape(n.id[:12])}</code> <span class="badge {escape(n.status)}">{escape(n.status)}'
                     f'</span> <span class="muted">{escape(n.note)}</span>')
            items.append(f'<li id="version-{escape(n.id)}">{label}{tree(n.id)}</li>')
        return f"<ul>{''.join(items)}</ul>" if items else ""

    return Markup(tree(None) or '<p class="muted">no versions stored</p>')


def render_report(store: RunStore, run_id: str) -> str:
    """The report of one run as HTML text: a training run's, or (any other run) its evaluations' with their
    failures and episodes (`evaluation.py`). KeyError when the run is not in the store."""
    run = load_run(store, run_id)
    if run.kind != "train":
        from .evaluation import render_eval_report

        return render_eval_report(store, run)
    arms = [r for r in training_runs(store) if r.config.get("env", {}).get("name") == run.config.get("env", {})
            .get("name")]
    env = Environment(loader=PackageLoader("ecdysis.report", "templates"), autoescape=True)  # model text is data
    template = env.get_template("report.html.j2")
    compared = [arm_result(row) for row in compare_arms(store)]
    return template.render(
        run=run, card=summary_card(run), plots=all_plots(run, arms, compare_curves(store)),
        compare=compare_sections(compared), compare_labels=[column_label(r) for r in compared],
        lineage_html=lineage_html(run.lineage), fmt=fmt, diff_lines=diff_lines,
        anchor=trajectory_anchor, store_path=str(store.path))


def write_report(store: RunStore, run_id: str, output: Path) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(render_report(store, run_id), encoding="utf-8")
    return output
