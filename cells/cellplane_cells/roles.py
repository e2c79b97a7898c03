"""The database roles of a cell's processes: one per use, each with only what it needs.

``sql/privileges.sql`` (applied by ``migrate`` after every migration run) gives
each its grants. Tenant secrets are kept from the roles that do not sign with
them by column privileges: ``tenants.signing_secret`` (it signs the calls to a
tenant's targets) is readable by the workers, ``webhook_endpoints.secret`` (it
signs webhooks) by the relay, both by the admin API (it creates tenants and
carries their rows through a move), neither by the tenant API.
"""

from __future__ import annotations

__all__ = ["API_ROLE", "ADMIN_API_ROLE", "WORKER_ROLE", "RELAY_ROLE", "PROCESS_ROLES"]

API_ROLE = "cellplane_api"
"""The tenant API (``cellplane cell serve``, port --port)."""
ADMIN_API_ROLE = "cellplane_admin_api"
"""The admin API (``cellplane cell serve``, port --admin-port)."""
WORKER_ROLE = "cellplane_worker"
"""The workers and the reaper (``cellplane cell work``)."""
RELAY_ROLE = "cellplane_relay"
"""The webhook relay (``cellplane cell work``, its own pool)."""
PROCESS_ROLES = (API_ROLE, ADMIN_API_ROLE, WORKER_ROLE, RELAY_ROLE)
