"""Print a pip constraints file that pins every runtime dependency to its floor.

Reads pyproject.toml: ``[project] dependencies`` and the extras named on the command line
(default: the runtime extras ``otel``, ``nvml``, ``trace``), turning each ``NAME>=X`` into ``NAME==X``
(markers kept).  CI installs the package with these constraints into a second venv and runs
the unit tests there, so the floors that pyproject.toml claims are the ones that are tested.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def floors(extras: list[str]) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    specs = list(project["dependencies"])
    for extra in extras:
        specs += project["optional-dependencies"][extra]
    pins: dict[str, str] = {}
    for spec in specs:
        req, _, marker = spec.partition(";")
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*(>=|==)\s*([0-9][^,\s]*)\s*(?:,\s*<[0-9][^,\s]*\s*)?", req)
        if m is None:
            continue  # no floor to pin (an unversioned name)
        name, _, version = m.groups()
        pins[name.lower()] = f"{name}=={version}" + (f"; {marker.strip()}" if marker else "")
    return sorted(pins.values())


if __name__ == "__main__":
    print("\n".join(floors(sys.argv[1:] or ["otel", "nvml", "trace"])))
