"""``python -m tracekit ARGS``: the ``tracekit`` command."""

import sys

from tracekit.cli import main

sys.exit(main())
