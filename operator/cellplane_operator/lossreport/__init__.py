"""The loss report of a takeover (the reconciliation report): what an old primary committed
that the promoted standby lacks.

The comparison is pure (``cellplane_operator.domain.reconciliation``); this
package reads both sites (``reader``), keeps the reports as files and
ConfigMaps (``store``) and prints them (``cli``: ``cellplane report``).
"""

from cellplane_operator.lossreport.reader import (
    ReconciliationError,
    build_report,
    read_end_lsn,
    read_fork_lsn,
    read_lease_deadline,
    read_snapshot,
    read_timeline,
)
from cellplane_operator.lossreport.store import ReportStore

__all__ = ["ReconciliationError", "ReportStore", "build_report", "read_end_lsn", "read_fork_lsn",
           "read_lease_deadline", "read_snapshot", "read_timeline"]
