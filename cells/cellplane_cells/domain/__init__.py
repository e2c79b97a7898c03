"""The cell's pure decisions: plans and quotas, retry timing, signatures, target checks, schedules.

No I/O and no clock of its own; an import-linter contract keeps psycopg, fastapi
and httpx out.
"""
