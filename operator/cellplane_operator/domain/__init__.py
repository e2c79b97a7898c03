"""The operator's pure core: decisions over plain data, no I/O and no clock of its own.

Nothing here may import kopf, the Kubernetes client, etcd clients, psycopg or an
HTTP library; an import-linter contract in pyproject.toml keeps it so.
"""
