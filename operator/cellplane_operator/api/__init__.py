"""The cellplane.io API: versioned pydantic models of the custom resources.

``v1alpha1`` holds the models the operator parses objects with; ``crdgen``
turns the same models into the CRDs in ``crds/``.
"""

from cellplane_operator.api import v1alpha1

__all__ = ["v1alpha1"]
