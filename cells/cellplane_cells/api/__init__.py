"""The cell's HTTP surfaces: the tenant API and, on its own port, the admin API."""
