"""``python -m minispec``: the same command line as ``minispec`` (see :mod:`minispec.cli`)."""

import sys

from minispec.cli import main

sys.exit(main())
