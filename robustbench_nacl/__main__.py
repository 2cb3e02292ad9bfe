"""``python -m robustbench_nacl`` runs the CLI."""

import sys

from .cli import main

sys.exit(main())
