"""``python -m qkm.cli ...``: the same as the ``qkm`` command."""

import sys

from ._main import main

sys.exit(main())
