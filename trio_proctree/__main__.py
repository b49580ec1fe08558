"""``python -m trio_proctree``: the same as the ``trio-proctree`` command."""

import sys

from ._cli import main

sys.exit(main())
