"""``python -m bnn.cli``: the ``bnn`` command."""

import sys

from bnn.cli.main import main

sys.exit(main())
