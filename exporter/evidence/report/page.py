"""The sections as one self-contained HTML page (styles inline, figures as base64 PNG, no script,
nothing fetched, printable) or as Markdown with its PNGs beside it."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

from .doc import Block, Figure, Items, Para, Section, Table

__all__ = ["html_page", "markdown_page", "slug"]

_CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#222;max-width:1200px;margin:2em auto;
padding:0 1em;line-height:1.45;font-size:14px}
h1{font-size:1.6em;border-bottom:2px solid #1f77b4;padding-bottom:.2em}
h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.15em}
table{border-collapse:collapse;margin:.6em 0;font-size:12.5px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f5f8}
caption{caption-side:bottom;text-align:left;color:#555;font-size:12px;padding-top:4px}
figure{margin:1em 0}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:12px}
nav ol{columns:2}
.meta{color:#555}
@media print{body{max-width:none;margin:0;font-size:11px}h2{page-break-after:avoid}
figure,table{page-break-inside:avoid}nav{display:none}}
"""


def slug(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-")


def _table_html(t: Table) -> str:
    e = html.escape
    out = ["<table>"]
    if t.caption:
        out.append(f"<caption>{e(t.caption)}</caption>")
    out.append("<thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in t.head) + "</tr></thead><tbody>")
    for i, row in enumerate(t.rows):
        cells = []
        for j, value in enumerate(row):
            if j in t.merge and i > 0 and t.rows[i - 1][: j + 1] == row[: j + 1]:
                continue  # merged into the cell above
            span = 1
            if j in t.merge:
                while i + span < len(t.rows) and t.rows[i + span][: j + 1] == row[: j + 1]:
                    span += 1
            attr = f' rowspan="{span}"' if span > 1 else ""
            cells.append(f"<td{attr}>{e(value)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _block_html(b: Block) -> str:
    e = html.escape
    if isinstance(b, Para):
        return f"<p>{e(b.text)}</p>"
    if isinstance(b, Items):
        return "<ul>" + "".join(f"<li>{e(x)}</li>" for x in b.items) + "</ul>"
    if isinstance(b, Table):
        return _table_html(b)
    data = base64.b64encode(b.png).decode("ascii")
    return (f'<figure><img alt="{e(b.alt)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(b.caption)}</figcaption></figure>")


def html_page(title: str, subtitle: str, sections: Sequence[Section]) -> str:
    e = html.escape
    nav = "".join(f'<li><a href="#{slug(s.title)}">{e(s.title)}</a></li>' for s in sections)
    body = "".join(f'<section id="{slug(s.title)}"><h2>{e(s.title)}</h2>' + "".join(map(_block_html, s.blocks))
                   + "</section>" for s in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>'
            f'<body><h1>{e(title)}</h1><p class="meta">{e(subtitle)}</p><nav><ol>{nav}</ol></nav>{body}'
            "</body></html>\n")


def _md_cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def _block_md(b: Block) -> str:
    if isinstance(b, Para):
        return b.text
    if isinstance(b, Items):
        return "\n".join(f"- {x}" for x in b.items)
    if isinstance(b, Table):
        lines = ["| " + " | ".join(map(_md_cell, b.head)) + " |", "|" + "---|" * len(b.head)]
        lines += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in b.rows]
        return "\n".join(lines) + (f"\n\n{b.caption}" if b.caption else "")
    return f"![{b.alt}]({b.name})\n\n{b.caption}"


def markdown_page(title: str, subtitle: str, sections: Sequence[Section], out: Path) -> str:
    """The Markdown text; each figure's PNG is written under ``out`` by its name."""
    for s in sections:
        for b in s.blocks:
            if isinstance(b, Figure):
                path = out / b.name
                path.parent.mkdir(parents=True, exist_ok=True)
                if not path.exists():
                    path.write_bytes(b.png)
    parts = [f"# {title}", subtitle]
    for s in sections:
        parts.append(f"## {s.title}")
        parts += [_block_md(b) for b in s.blocks]
    return "\n\n".join(parts) + "\n"
