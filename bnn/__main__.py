"""``python -m bnn``: the ``bnn`` command."""

import sys

from bnn.cli import main

sys.exit(main())
