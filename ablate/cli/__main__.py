"""`python -m ablate.cli`: the `ablate` console script."""

import sys

from ablate.cli import main

sys.exit(main())
