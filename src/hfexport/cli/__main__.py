"""``python -m hfexport.cli``: the ``hfexport`` command."""

import sys

from . import main

sys.exit(main())
