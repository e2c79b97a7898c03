"""The edge router: any tenant's request, forwarded to the active site of the tenant's cell."""

from cellplane_operator.router.app import RouterSettings, create_router_app
from cellplane_operator.router.watcher import PlacementWatcher

__all__ = ["RouterSettings", "create_router_app", "PlacementWatcher"]
