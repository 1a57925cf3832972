"""The name DAGs imported `checkpoint_tasks` from before 0.2.0. It moved to
`exactly_once.orchestration.checkpoint_tasks`; this module keeps the old imports working, with
a DeprecationWarning, until 0.3.0 removes it (CHANGELOG.md). The one module at the package's
root that imports the Airflow adapter above it: it is an alias, nothing imports it."""

import warnings

from exactly_once.orchestration.checkpoint_tasks import REPROCESS, IncrementOperator, checkpoint_tasks

warnings.warn("exactly_once.airflow_tasks is deprecated and goes in 0.3.0: import checkpoint_tasks from "
              "exactly_once.orchestration.checkpoint_tasks", DeprecationWarning, stacklevel=2)

__all__ = ["REPROCESS", "IncrementOperator", "checkpoint_tasks"]
