"""Views of a serve run (read-only): per conversation its turns, tokens, latency, repairs and outcome;
a terminal table for `ecdysis show` and a small self-contained HTML page for `ecdysis report`."""

from __future__ import annotations

import html
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..store.db import RunStore
from .record import OUTCOME_KIND, TURN_KIND


def serve_summary(store: RunStore, run_id: str) -> dict[str, Any]:
    """The run's conversations with their turns and outcomes, and totals (the proxy's overhead percentiles)."""
    turns: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _, turn in store.records(run_id, TURN_KIND):
        turns[turn["conversation"]].append(turn)
    outcomes: dict[str, dict[str, Any]] = {}
    for run in store.runs():  # an outcome may arrive while a later serve run of the store is up
        if run["kind"] == "serve":
            outcomes.update({key: value for key, value in store.records(run["id"], OUTCOME_KIND) if key in turns})
    conversations = []
    for conv, items in turns.items():
        items.sort(key=lambda t: t["index"])
        repairs = sorted({r for t in items for r in t["repairs"]})
        conversations.append({
            "conversation": conv, "turns": items, "n_turns": len(items),
            "prompt_tokens": sum(t["prompt_tokens"] for t in items),
            "completion_tokens": sum(t["completion_tokens"] for t in items),
            "upstream_calls": sum(t["attempts"] for t in items),
            "latency_s": sum(t["latency_s"] for t in items), "repairs": repairs,
            "rejections": sum(len(t["rejections"]) for t in items),
            "errors": sum(t["status"] != 200 for t in items), "outcome": outcomes.get(conv)})
    overhead = sorted(t["overhead_ms"] for items in turns.values() for t in items if t["status"] == 200)

    def pct(q: float) -> float | None:
        return overhead[min(len(overhead) - 1, int(q * len(overhead)))] if overhead else None

    totals = {"conversations": len(conversations), "turns": sum(len(v) for v in turns.values()),
              "scored": sum(c["outcome"] is not None for c in conversations),
              "overhead_ms_p50": pct(0.5), "overhead_ms_p95": pct(0.95),
              "overhead_ms_mean": statistics.fmean(overhead) if overhead else None}
    return {"totals": totals, "conversations": conversations}


def _outcome_text(outcome: dict[str, Any] | None) -> str:
    if outcome is None:
        return "-"
    return f"{'pass' if outcome['passed'] else 'fail'} ({outcome['score']:g})"


def show_serve(console: Console, store: RunStore, run: dict[str, Any]) -> None:
    """`ecdysis show` for a serve run."""
    data = serve_summary(store, run["id"])
    t = data["totals"]
    p50, p95 = t["overhead_ms_p50"], t["overhead_ms_p95"]
    console.print(f"[bold]serve run {run['id']}[/] ({run['status']}): {t['conversations']} conversations, "
                  f"{t['turns']} turns, {t['scored']} scored; proxy overhead per turn "
                  + (f"p50 {p50:.2f} ms, p95 {p95:.2f} ms" if p50 is not None else "-"))
    table = Table(title="Conversations")
    for name in ("conversation", "turns", "upstream calls", "tokens (prompt + completion)", "latency",
                 "repairs", "retried", "errors", "outcome"):
        table.add_column(name, no_wrap=name == "conversation")
    for c in data["conversations"]:
        table.add_row(c["conversation"], str(c["n_turns"]), str(c["upstream_calls"]),
                      f"{c['prompt_tokens']} + {c['completion_tokens']}", f"{c['latency_s']:.2f}s",
                      ", ".join(c["repairs"]) or "-", str(c["rejections"]), str(c["errors"]),
                      _outcome_text(c["outcome"]))
    console.print(table)


def write_serve_report(store: RunStore, run: dict[str, Any], output: Path) -> Path:
    """`ecdysis report` for a serve run: one HTML file, a table per conversation (nothing fetched)."""
    data = serve_summary(store, run["id"])
    esc = html.escape
    rows = []
    for c in data["conversations"]:
        turns = "".join(
            f"<tr><td>{t['index']}</td><td>{t['status']}</td><td>{t['attempts']}</td>"
            f"<td>{t['prompt_tokens']} + {t['completion_tokens']}</td><td>{t['latency_s'] * 1000:.1f} ms</td>"
            f"<td>{t['overhead_ms']:.2f} ms</td><td>{esc(', '.join(t['repairs']) or '-')}</td>"
            f"<td>{esc(', '.join(t['rejections']) or '-')}</td><td>{esc(t['stopped'] or t['error'] or '')}</td></tr>"
            for t in c["turns"])
        rows.append(f"<h2>{esc(c['conversation'])} <small>{esc(_outcome_text(c['outcome']))}</small></h2>"
                    "<table><tr><th>turn</th><th>status</th><th>upstream calls</th><th>tokens</th><th>latency</th>"
                    "<th>proxy overhead</th><th>repairs</th><th>retried for</th><th>note</th></tr>"
                    f"{turns}</table>")
    t = data["totals"]
    body = (f"<h1>ecdysis serve run {esc(run['id'])}</h1><p>{t['conversations']} conversations, {t['turns']} turns, "
            f"{t['scored']} scored; proxy overhead p50 {t['overhead_ms_p50'] or 0:.2f} ms, "
            f"p95 {t['overhead_ms_p95'] or 0:.2f} ms</p>" + "".join(rows))
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}")
    output.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>serve {esc(run['id'])}</title>"
                      f"<style>{style}</style></head><body>{body}</body></html>")
    return output
