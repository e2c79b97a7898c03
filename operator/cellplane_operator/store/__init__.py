"""The ownership table's storage: a small key-value interface of ours over etcd.

``KeyValueStore`` is what the rest of cellplane depends on; ``EtcdStore`` is the
real adapter (aetcd, several members, bounded time); ``InMemoryStore`` is the
in-package fake for unit tests of the logic built on top.
"""

from cellplane_operator.store.base import (
    Compare,
    Delete,
    KeyValueStore,
    Put,
    VersionedValue,
    WatchEvent,
)
from cellplane_operator.store.etcd import EtcdStore
from cellplane_operator.store.memory import InMemoryStore

__all__ = ["Compare", "Delete", "EtcdStore", "InMemoryStore", "KeyValueStore", "Put",
           "VersionedValue", "WatchEvent"]
