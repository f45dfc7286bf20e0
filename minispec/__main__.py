import sys

from minispec.cli import main

sys.exit(main())
