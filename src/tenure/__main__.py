"""``python -m tenure``: the command line (``tenure.cli``)."""

import sys

from .cli import main

sys.exit(main())
