"""`python -m matgptq.cli ...` runs the `matgptq` command."""

import sys

from . import main

sys.exit(main())
