"""The serve commands, kept here so `cli/main.py` only registers them: `ecdysis serve`, the
`--from-traces` branch of `ecdysis train`, and the serve-run views of `show` and `report`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..cli.common import console, fail
from ..harness.manifest import HarnessError
from ..models.base import ModelConfigError


def serve(
    harness: Annotated[Path, typer.Option(help="Harness directory (e.g. RUN_DIR/frozen/ID).")],
    upstream: Annotated[str, typer.Option(help="Upstream model reference: local:NAME, openai:MODEL, "
                                               "http://HOST:PORT/v1::MODEL, ollama:MODEL.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    store: Annotated[Path, typer.Option(help="Run store recording the conversations.")] = Path("runs/serve"),
    record: Annotated[bool, typer.Option(help="Record conversations in --store.")] = True,
    max_concurrency: Annotated[int, typer.Option(help="Requests processed at once.")] = 16,
    max_pending: Annotated[int, typer.Option(help="Requests in the proxy at once; more get HTTP 429.")] = 256,
    max_body_kb: Annotated[int, typer.Option(help="Largest request body (KB); larger get HTTP 413.")] = 4000,
    retries: Annotated[int | None, typer.Option(help="H2 retries per turn (default: the harness's "
                                                     "budget.max_rejections).")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable holding the key clients "
                                                         "must send (Authorization: Bearer).")] = None,
    model_name: Annotated[str | None, typer.Option(help="Model id listed by /v1/models.")] = None,
    upstream_timeout: Annotated[float, typer.Option(help="Seconds per upstream call, retries included.")] = 300.0,
    log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
    trust_harness_code: Annotated[bool, typer.Option(help="Run the harness's action.py/regulate.py in the proxy "
                                                          "process instead of its sandboxed worker.")] = False,
) -> None:
    """Serve a harness as an OpenAI-compatible endpoint in front of an upstream model, recording what it sees.

    Point an unmodified agent (OpenAI SDK, agent frameworks) at http://HOST:PORT/v1. Upstream keys are read
    from the environment only (OPENAI_API_KEY, ECDYSIS_API_KEY)."""
    from ..store.db import RunDirBusy
    from .proxy import ServeSettings
    from .server import build_proxy, run

    settings = ServeSettings(host=host, port=port, max_concurrency=max_concurrency, max_pending=max_pending,
                             max_body_bytes=max_body_kb * 1000, retries=retries, api_key_env=api_key_env,
                             model_name=model_name, upstream_timeout_s=upstream_timeout,
                             trust_harness_code=trust_harness_code)
    try:
        proxy = build_proxy(harness, upstream, settings, store if record else None)
    except (HarnessError, ModelConfigError, RunDirBusy, ValueError) as exc:
        fail(f"cannot serve: {exc}")
        return
    console.print(f"serving harness {proxy.harness.name} ({proxy.harness.id}) on http://{host}:{port}/v1 "
                  f"with upstream {upstream}" + (f"; recording in {store}" if record else "")
                  + f"; harness code: {proxy.harness.isolation}")
    run(proxy, log_level)


def train_from_traces(store: Path, harness: Path | None, out: Path | None, as_json: bool = False) -> None:
    """`ecdysis train --from-traces STORE`: aggregate scored served conversations, propose and verify an edit
    (`as_json`: the `TracesResult` as JSON on stdout)."""
    from ..store.db import RunDirBusy
    from ..trainer.from_traces import run_from_traces

    try:
        result = run_from_traces(store, harness, out)
    except (HarnessError, ValueError, KeyError, RunDirBusy) as exc:
        fail(str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc))
        return
    if as_json:
        print(result.model_dump_json(indent=1))
        return
    console.print(f"[bold]from traces[/] {result.store}: {result.conversations} scored conversations "
                  f"({result.failing} failing) served by harness {result.harness_id}"
                  + (f"; {result.skipped} served by other versions skipped" if result.skipped else ""))
    for p in result.patterns:
        console.print(f"  {p['id']} [{p['classification']}, {p['layer']}] {p['name']} "
                      f"({len(p['conversations'])} conversations)", markup=False)
    for proposal in result.proposals:
        status = "[green]verified by replay[/]" if proposal.validated else "[yellow]unvalidated[/]"
        console.print(f"  {proposal.pattern} {proposal.layer}: {proposal.lever} — {status}; {proposal.evidence}",
                      highlight=False)
    for note in result.notes:
        console.print(f"  [dim]{note}[/]")
    if result.candidate_id:
        console.print(f"candidate harness {result.candidate_id} written to {result.out_dir}/harness "
                      f"(spec in {result.out_dir}/SPEC.json); serve it with "
                      f"`ecdysis serve --harness {result.out_dir}/harness --upstream ...`")
    else:
        console.print(f"[yellow]no candidate harness written[/]: {result.no_candidate}", highlight=False)
    console.print(f"[dim]report: {result.out_dir}/traces_report.json[/]")


def show_run(store: Any, record: dict[str, Any], as_json: bool) -> None:
    """`ecdysis show` on a serve run."""
    from ..cli import views
    from .view import serve_summary, show_serve

    if as_json:
        views.print_json({"run": views.decoded(record), **serve_summary(store, record["id"])})
        return
    show_serve(console, store, record)


def report_run(store: Any, record: dict[str, Any], output: Path) -> None:
    """`ecdysis report` on a serve run."""
    from .view import write_serve_report

    path = write_serve_report(store, record, output)
    console.print(f"report written to {path} ({path.stat().st_size // 1024} KB)")
