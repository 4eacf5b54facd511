"""``python -m trl_multiagent.cli``: the ``trl-multiagent`` command."""

import sys

from .commands import main

sys.exit(main())
