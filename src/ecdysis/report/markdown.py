"""Rich tables as GitHub Markdown, so a summary can be pasted into a README or a paper instead of retyped.

`to_markdown` takes what the CLI printed (rich `Table`s and plain paragraphs, kept as they are) and returns the
same content as Markdown: a table's title as a bold line, its header, one row per row (a section break is an empty row,
since Markdown tables have no rules), right-justified columns right-aligned. Cells are rendered as the console
renders them (markup applied, then dropped), so the Markdown says what the terminal said.
"""
from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text

_CONSOLE = Console(width=10**4, color_system=None)


def _plain(value: object) -> str:
    """The text a cell shows, without styles; pipes escaped and line breaks joined for a Markdown cell."""
    if isinstance(value, Text):
        text = value.plain
    elif isinstance(value, str):
        text = _CONSOLE.render_str(value).plain
    elif value is None:
        text = ""
    else:
        text = str(value)
    return " ".join(text.split()).replace("|", "\\|")


def table_markdown(table: Table) -> str:
    """One rich table as a Markdown table (title above it in bold, caption below it); a table without columns
    is its title alone."""
    lines = [f"**{_plain(table.title)}**", ""] if table.title else []
    columns = table.columns
    if not columns:
        return "\n".join(lines).strip()
    lines.append("| " + " | ".join(_plain(c.header) for c in columns) + " |")
    lines.append("|" + "|".join("---:" if c.justify == "right" else "---" for c in columns) + "|")
    cells = [list(c.cells) for c in columns]
    for i, row in enumerate(table.rows):
        lines.append("| " + " | ".join(_plain(col[i]) if i < len(col) else "" for col in cells) + " |")
        if row.end_section and i < len(table.rows) - 1:
            lines.append("|" + "|".join(" " for _ in columns) + "|")
    if table.caption:
        lines += ["", _plain(table.caption)]
    return "\n".join(lines)


def to_markdown(shown: Iterable[Table | str], heading: str | None = None) -> str:
    """Everything shown, in order, as one Markdown document (tables and paragraphs separated by blank lines)."""
    parts = [f"# {heading}"] if heading else []
    for item in shown:  # a paragraph's own line breaks are kept (a Markdown hard break: two trailing spaces)
        parts.append(table_markdown(item) if isinstance(item, Table) else "  \n".join(item.strip().splitlines()))
    return "\n\n".join(parts) + "\n"
