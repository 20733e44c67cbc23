"""`python -m kiln.bench ...` runs `kiln bench ...` (see kiln/bench/cli.py)."""
import sys

from .cli import main

sys.exit(main())
