"""``evidence report --format html|md``: the seed's Day-0 report from the records.

Its parts, in the order the data flows: :mod:`.cells` (what each scenario's cell was: announced
by ``load``, or from ``--plan``), :mod:`.model` (``evidence summarize``'s medians placed in the core
matrix, the rate sweep and the totals), the sections (:mod:`.sections`, :mod:`.failures`,
:mod:`.caveats`, :mod:`.boards`), :mod:`.figures` (PNG), :mod:`.page` (HTML or Markdown) and
:mod:`.write` (the files and their manifest); :mod:`.command` is the CLI around them.
"""

from __future__ import annotations

__all__: list[str] = []
