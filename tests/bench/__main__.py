"""`python -m tests.bench [--quick]`: every benchmark; JSON on stdout, a table on stderr."""

from __future__ import annotations

import sys

from tests.bench.run import main

sys.exit(main())
