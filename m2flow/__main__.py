"""``python -m m2flow`` runs the command line."""

import sys

from m2flow.cli import main

sys.exit(main())
