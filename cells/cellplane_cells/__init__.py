"""The cell stack: the tenants' job API, workers, the Postgres queue, and the edge router.

Built by the cell-stack issue; the foundation only reserves the package.
"""

__all__: list[str] = []
