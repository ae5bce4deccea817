"""``python -m tracekit.cli ARGS``: the ``tracekit`` command (memlimit's guarded child runs this)."""

import sys

from tracekit.cli import main

sys.exit(main())
