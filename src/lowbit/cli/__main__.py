"""``python -m lowbit.cli``: the ``lowbit`` command."""

import sys

from lowbit.cli import main

sys.exit(main())
