"""`python -m matgptq ...` runs the `matgptq` command."""

import sys

from .cli import main

sys.exit(main())
