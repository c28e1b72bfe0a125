"""mmrl's test suite: a package, so test modules import as `tests.<folder>.<module>` and never shadow
the code they test (`tests/rewards` and `rewards`). Shared helpers are fixtures in the `conftest.py`
of the folder that shares them; this module holds only the two paths that module-level code
(parametrize lists, file references) needs before any fixture runs."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BANDIT = os.path.join(REPO, "configs", "tiny", "bandit.yaml")
