"""The cell processes' configuration: flags, falling back to CELLPLANE_CELL_* variables."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

__all__ = ["CellSettings", "add_common_arguments", "settings_from"]


@dataclass(frozen=True)
class CellSettings:
    database: str
    """libpq conninfo of the cell's Postgres primary."""
    cell: str
    """The cell's name; recorded in the placement-group row."""
    epoch: int
    """The placement-group epoch this process acts under (the lease owner gives it)."""
    allow_private_targets: bool = False
    """Development mode: loopback and private addresses may be targets and webhooks."""
    admin_database: str | None = None
    """The admin API's conninfo (its own role, which may read tenant secrets to move them);
    None: ``database``."""
    relay_database: str | None = None
    """The webhook relay's conninfo (its own role, which may read webhook secrets to sign);
    None: ``database``."""


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"CELLPLANE_CELL_{name}", default)


def add_common_arguments(parser: argparse.ArgumentParser, *, admin_pool: bool = False,
                         relay_pool: bool = False) -> None:
    """Flags every cell command takes, plus the second pool's conninfo for the command that
    opens one (serve: the admin API's; work: the webhook relay's)."""
    parser.add_argument("--database", default=_env("DATABASE"),
                        help="libpq conninfo of the cell database (CELLPLANE_CELL_DATABASE)")
    if admin_pool:
        parser.add_argument("--admin-database", default=_env("ADMIN_DATABASE"),
                            help="conninfo of the admin API's pool, when its role differs "
                                 "(CELLPLANE_CELL_ADMIN_DATABASE; default: --database)")
    if relay_pool:
        parser.add_argument("--relay-database", default=_env("RELAY_DATABASE"),
                            help="conninfo of the webhook relay's pool, when its role differs "
                                 "(CELLPLANE_CELL_RELAY_DATABASE; default: --database)")
    parser.add_argument("--cell", default=_env("NAME", "cell"),
                        help="cell name (CELLPLANE_CELL_NAME)")
    parser.add_argument("--epoch", type=int, default=int(_env("EPOCH", "0") or 0),
                        help="placement-group epoch to act under (CELLPLANE_CELL_EPOCH)")
    parser.add_argument("--allow-private-targets", action="store_true",
                        default=_env("ALLOW_PRIVATE_TARGETS", "") in ("1", "true"),
                        help="development mode: allow loopback/private target addresses")


def settings_from(args: argparse.Namespace) -> CellSettings:
    if not args.database:
        raise SystemExit("cellplane cell: --database (or CELLPLANE_CELL_DATABASE) is required")
    if args.epoch < 1:
        raise SystemExit("cellplane cell: --epoch (or CELLPLANE_CELL_EPOCH) must be >= 1")
    return CellSettings(database=args.database, cell=args.cell, epoch=args.epoch,
                        allow_private_targets=args.allow_private_targets,
                        admin_database=getattr(args, "admin_database", None),
                        relay_database=getattr(args, "relay_database", None))
