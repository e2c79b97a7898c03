"""The phases the controllers write are the phases the CRDs allow: the resource models
(which the CRDs are generated from) list them as literals, the domain as enums."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, get_args

import pytest

from cellplane_operator.api import v1alpha1
from cellplane_operator.domain.cells import CellPhase
from cellplane_operator.domain.moves import MovePhase
from cellplane_operator.domain.tenants import TenantPhase


@pytest.mark.parametrize(("literal", "enum"), [
    (v1alpha1.CellPhase, CellPhase), (v1alpha1.TenantPhase, TenantPhase),
    (v1alpha1.MovePhase, MovePhase)], ids=["cell", "tenant", "move"])
def test_the_crd_and_the_domain_name_the_same_phases(literal: Any, enum: type[StrEnum]) -> None:
    assert list(get_args(literal)) == [member.value for member in enum]
