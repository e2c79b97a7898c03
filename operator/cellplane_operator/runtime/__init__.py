"""The regional operator's controllers: cell sites, tenant placement, and the process around them."""

from cellplane_operator.runtime.region import RegionRuntime

__all__ = ["RegionRuntime"]
