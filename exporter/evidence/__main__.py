"""``python -m exporter.evidence``: the ``evidence`` command."""

import sys

from .cli import main

sys.exit(main())
