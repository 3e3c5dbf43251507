"""The report as plain blocks (paragraphs, lists, tables, figures) under section headings, so that
one set of sections becomes both the HTML page and the Markdown file."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Para", "Items", "Table", "Figure", "Section", "Block", "SECTION_TITLES"]

#: every section, in the seed's order (the browser test looks for each heading)
SECTION_TITLES = ("What ran", "Core matrix", "Figures against concurrency", "Throughput against interactivity",
                  "Rate sweep", "Where TTFT went", "Failures", "Boards", "Caveats", "Attachments", "History")


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Items:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    head: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    #: columns (0-based) whose equal consecutive values are merged (rowspan) in HTML
    merge: tuple[int, ...] = ()
    caption: str = ""


@dataclass(frozen=True)
class Figure:
    name: str  # file name of its PNG (report.md); the HTML inlines it
    png: bytes
    caption: str
    alt: str


Block = Para | Items | Table | Figure


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)
