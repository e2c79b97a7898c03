"""A kubernetes-driver site as objects (``domain/site_objects.py``, ``site_names.py``).
Pure: no apiserver, no database. What a returning site becomes is the runner's
``domain/failover.site_role`` (tests/unit/test_failover_rules.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellplane_operator.api.v1alpha1 import API_VERSION
from cellplane_operator.domain.site_names import (
    MAX_CELL_AND_REGION,
    STATEFUL_SET_NAME_MAX,
    site_names,
    site_object_refs,
)
from cellplane_operator.domain.site_objects import (
    IMAGE_USER,
    REGION_LABEL,
    KubernetesSite,
    ServingRole,
    SiteSecrets,
    object_ref,
    role_change,
    site_objects,
    warm_api_objects,
)
from cellplane_operator.sites.credentials import ROLES, secret_name

NAMESPACE = "cellplane-system"
ACTIVE = KubernetesSite(cell="c1", cell_uid="0b6f3c2e-uid", region="region-a",
                        role=ServingRole.ACTIVE, epoch=4,
                        image="localhost/cellplane-operator:0.1.0", namespace=NAMESPACE,
                        secrets=SiteSecrets.for_cell("c1"),
                        storage_class="fast-ssd", storage_size="5Gi")
STANDBY = replace(ACTIVE, region="region-b", role=ServingRole.STANDBY)


def by_kind(site: KubernetesSite, kind: str) -> list[dict[str, Any]]:
    return [m for m in site_objects(site) if m["kind"] == kind]


def one(site: KubernetesSite, kind: str, component: str) -> dict[str, Any]:
    [found] = [m for m in by_kind(site, kind)
               if m["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return found


def pod_templates(site: KubernetesSite) -> Iterator[tuple[str, dict[str, Any]]]:
    for manifest in site_objects(site):
        if manifest["kind"] in ("StatefulSet", "Deployment"):
            yield manifest["metadata"]["name"], manifest["spec"]["template"]


def keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from keys(item)


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


# -- placement and storage ------------------------------------------------------------------

def test_every_pod_is_pinned_to_its_region() -> None:
    templates = dict(pod_templates(ACTIVE))
    assert len(templates) == 3  # database, api, worker
    for name, template in templates.items():
        assert template["spec"]["nodeSelector"] == {REGION_LABEL: "region-a"}, name
    for _, template in pod_templates(STANDBY):
        assert template["spec"]["nodeSelector"] == {REGION_LABEL: "region-b"}


def test_the_claim_has_the_cells_storage_class_and_size() -> None:
    [claim] = one(ACTIVE, "StatefulSet", "database")["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    container = one(ACTIVE, "StatefulSet", "database")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": claim["metadata"]["name"], "mountPath": "/var/lib/cellplane/site"} \
        in container["volumeMounts"]


def test_a_cell_without_a_storage_class_gets_the_clusters_default() -> None:
    # "" would bind only to volumes without a class; an absent field takes the default.
    [claim] = one(replace(ACTIVE, storage_class=None), "StatefulSet",
                  "database")["spec"]["volumeClaimTemplates"]
    assert "storageClassName" not in claim["spec"]


def test_the_agent_service_reaches_a_held_pod_on_the_agent_and_reading_ports() -> None:
    [agent] = [s for s in by_kind(STANDBY, "Service")
               if s["metadata"]["name"] == STANDBY.names.agent]
    assert agent["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in agent["spec"]["ports"]} == {"agent": 9443,
                                                                       "reading": 5433}
    container = one(STANDBY, "StatefulSet", "database")["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"] for p in container["ports"]} == {"postgres", "agent", "reading"}


def test_a_warmed_api_becomes_the_active_one_without_a_new_revision() -> None:
    warm = {m["kind"]: m for m in warm_api_objects(replace(STANDBY, epoch=5))}
    active = {m["kind"]: m for m in by_kind(replace(STANDBY, role=ServingRole.ACTIVE,
                                                    epoch=5), "Deployment")
              + by_kind(replace(STANDBY, role=ServingRole.ACTIVE, epoch=5), "Service")
              if m["metadata"]["name"] == STANDBY.names.api}
    assert set(warm) == set(active) == {"Deployment", "Service"}
    for kind, manifest in warm.items():
        assert manifest["metadata"]["labels"]["cellplane.io/role"] == "standby"
        assert manifest["spec"] == active[kind]["spec"]  # only metadata changes at promotion
    # No workers ahead: nothing may take work from a standby's read-only database.
    assert "worker" not in json.dumps([m["metadata"]["name"] for m in warm.values()])


def test_the_claim_is_kept_unless_the_cell_says_delete() -> None:
    def policy(site: KubernetesSite) -> Any:
        return one(site, "StatefulSet", "database")["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert policy(ACTIVE) == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert policy(replace(ACTIVE, delete_claims=True))["whenDeleted"] == "Delete"


def test_the_database_restarts_only_when_the_operator_deletes_its_pod() -> None:
    spec = one(ACTIVE, "StatefulSet", "database")["spec"]
    assert spec["replicas"] == 1
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["serviceName"] == site_names("c1", "region-a").pods


# -- secrets ---------------------------------------------------------------------------------

def env_of(site: KubernetesSite) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    for name, template in pod_templates(site):
        for container in template["spec"]["containers"]:
            yield f"{name}/{container['name']}", container.get("env", [])


def test_no_password_or_token_is_written_into_an_object() -> None:
    objects = site_objects(ACTIVE)
    assert not any(m["kind"] == "Secret" for m in objects)
    assert not {"data", "stringData", "httpHeaders"} & set(keys(objects))
    for where, env in env_of(ACTIVE):
        for entry in env:
            if re.search("PASSWORD|TOKEN", entry["name"]):
                assert set(entry) == {"name", "valueFrom"}, (where, entry["name"])
                assert "secretKeyRef" in entry["valueFrom"], (where, entry["name"])
    # Every password in a conninfo is a $(VAR) the kubelet expands, never a value.
    passwords = [s for s in strings(objects) if "password=" in s]
    assert len(passwords) == 4  # api, admin api, worker, relay
    for text in passwords:
        assert re.search(r"password=\$\([A-Z_]+\)( |$)", text), text


def test_each_dollar_reference_names_an_earlier_secret_variable() -> None:
    """The kubelet expands $(VAR) only from entries above it; otherwise the literal text
    ``$(VAR)`` would reach libpq as the password."""
    for where, env in env_of(ACTIVE):
        seen: dict[str, dict[str, Any]] = {}
        for entry in env:
            for referenced in re.findall(r"\$\(([A-Z_]+)\)", entry.get("value", "")):
                assert referenced in seen, (where, entry["name"], referenced)
            seen[entry["name"]] = entry


def test_database_passwords_come_from_the_cells_secret_by_role() -> None:
    secrets = SiteSecrets.for_cell("c1")
    assert secrets.database == secret_name("c1")
    refs = [e["valueFrom"]["secretKeyRef"] for _, env in env_of(ACTIVE) for e in env
            if "secretKeyRef" in e.get("valueFrom", {})]
    database_keys = {r["key"] for r in refs if r["name"] == secrets.database}
    assert database_keys == {"cellplane_api", "cellplane_admin_api", "cellplane_worker",
                             "cellplane_relay"}
    assert database_keys <= set(ROLES)
    assert {r["name"] for r in refs if r["key"] == "token"} == {secrets.admin_token}
    pod = one(ACTIVE, "StatefulSet", "database")["spec"]["template"]["spec"]
    assert {"name": "database-credentials",
            "secret": {"secretName": secrets.database, "defaultMode": 0o400}} in pod["volumes"]
    assert {"name": "agent-token",
            "secret": {"secretName": secrets.agent_token, "defaultMode": 0o400}} in pod["volumes"]
    assert "--token-file=/etc/cellplane/agent/token" in pod["containers"][0]["args"]


def test_cell_processes_reach_the_database_through_its_service() -> None:
    host = f"host=cell-c1-region-a-db.{NAMESPACE}.svc.cluster.local port=5432"
    conninfos = {where + ":" + e["name"]: e["value"] for where, env in env_of(ACTIVE)
                 for e in env if e["name"].endswith("DATABASE") and "value" in e}
    assert len(conninfos) == 4
    for where, value in conninfos.items():
        assert value.startswith(host), where
    assert "user=cellplane_api " in conninfos["cell-c1-region-a-api/api:CELLPLANE_CELL_DATABASE"]
    assert "user=cellplane_relay " in \
        conninfos["cell-c1-region-a-worker/worker:CELLPLANE_CELL_RELAY_DATABASE"]
    [database_service] = [m for m in by_kind(ACTIVE, "Service")
                          if m["metadata"]["name"] == "cell-c1-region-a-db"]
    assert database_service["spec"]["ports"][0]["port"] == 5432
    assert database_service["spec"].get("clusterIP") != "None"


# -- security --------------------------------------------------------------------------------

def test_every_pod_and_container_is_locked_down() -> None:
    checked = 0
    for name, template in pod_templates(ACTIVE):
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == IMAGE_USER == 65532
        assert pod["securityContext"]["fsGroup"] == IMAGE_USER
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, container["name"]
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["readOnlyRootFilesystem"] is True
            assert container["resources"]["limits"]["memory"]
            assert container["resources"]["requests"]["cpu"]
            writable = {m["mountPath"] for m in container["volumeMounts"]
                        if m["name"] in empty_dirs}
            assert "/tmp" in writable
            checked += 1
    assert checked == 3


def test_postgres_writes_its_sockets_and_shared_memory_to_empty_dirs() -> None:
    pod = one(ACTIVE, "StatefulSet", "database")["spec"]["template"]["spec"]
    kinds = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert "emptyDir" in kinds[mounts["/var/run/postgresql"]]
    assert kinds[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


# -- role, epoch, selectors ------------------------------------------------------------------

def components(site: KubernetesSite) -> set[tuple[str, str]]:
    return {(m["kind"], m["metadata"]["labels"]["app.kubernetes.io/component"])
            for m in site_objects(site)}


def test_api_and_workers_run_on_the_active_site_only() -> None:
    database = {("StatefulSet", "database"), ("Service", "database")}
    assert components(STANDBY) == database
    assert components(ACTIVE) == database | {("Deployment", "api"), ("Service", "api"),
                                             ("Deployment", "worker")}
    service = one(ACTIVE, "Service", "api")
    assert {(p["name"], p["port"]) for p in service["spec"]["ports"]} == {("api", 8080),
                                                                           ("admin", 8081)}


def selectors(manifest: dict[str, Any]) -> dict[str, str]:
    spec = manifest["spec"]
    found: dict[str, str] = spec["selector"]["matchLabels"] if "matchLabels" in spec.get(
        "selector", {}) else spec["selector"]
    return found


def test_selectors_and_the_database_pod_never_carry_role_or_epoch() -> None:
    for manifest in site_objects(ACTIVE):
        labels = selectors(manifest)
        assert "cellplane.io/role" not in labels, manifest["metadata"]["name"]
        assert labels["cellplane.io/region"] == "region-a"
        assert manifest["metadata"]["labels"]["cellplane.io/role"] == "active"
        assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == \
            "cellplane-operator"
        if "template" in manifest["spec"]:
            template_labels = manifest["spec"]["template"]["metadata"]["labels"]
            assert labels.items() <= template_labels.items()
            assert "cellplane.io/role" not in template_labels
    statefulset = one(ACTIVE, "StatefulSet", "database")
    later = one(replace(ACTIVE, role=ServingRole.STANDBY, epoch=9), "StatefulSet", "database")
    assert later["spec"] == statefulset["spec"]


def test_a_new_epoch_rolls_the_api_and_workers() -> None:
    before = one(ACTIVE, "Deployment", "worker")
    after = one(replace(ACTIVE, epoch=5), "Deployment", "worker")
    assert before["spec"]["template"] != after["spec"]["template"]
    assert after["spec"]["template"]["metadata"]["annotations"] == {"cellplane.io/epoch": "5"}
    assert after["spec"]["strategy"] == {"type": "Recreate"}


def test_workers_run_with_the_cells_slots_and_priority_floors() -> None:
    def args(site: KubernetesSite) -> list[str]:
        worker = one(site, "Deployment", "worker")["spec"]["template"]["spec"]["containers"][0]
        found: list[str] = worker["args"]
        return found

    # No floors on the Cell: no flag, so the worker's own default shares (and a template
    # that a cell made before floors were configurable keeps).
    assert args(replace(ACTIVE, slots_per_worker=8)) == [
        "cell", "work", "--slots=8", "--worker-id=$(POD_NAME)"]
    floored = replace(ACTIVE, slots_per_worker=8,
                      priority_floors="CRITICAL=2,HIGH=2,DEFAULT=1,LOW=1")
    assert args(floored) == ["cell", "work", "--slots=8",
                             "--priority-floors=CRITICAL=2,HIGH=2,DEFAULT=1,LOW=1",
                             "--worker-id=$(POD_NAME)"]
    # A change of floors is a new Pod template: the Deployment rolls its workers.
    changed = replace(floored, priority_floors="CRITICAL=4,HIGH=0,DEFAULT=0,LOW=0")
    assert (one(changed, "Deployment", "worker")["spec"]["template"]
            != one(floored, "Deployment", "worker")["spec"]["template"])


def test_a_switchover_creates_and_deletes_the_serving_objects_and_relabels_the_rest() -> None:
    down = role_change(ACTIVE, ServingRole.STANDBY)
    names = site_names("c1", "region-a")
    assert {(r.kind, r.name) for r in down.delete} == {
        ("Deployment", names.api), ("Service", names.api), ("Deployment", names.worker)}
    assert down.create == ()
    assert {m["metadata"]["name"] for m in down.relabel} == {
        names.database, names.pods, names.agent}
    assert all(m["metadata"]["labels"]["cellplane.io/role"] == "standby" for m in down.relabel)
    up = role_change(replace(ACTIVE, role=ServingRole.STANDBY), ServingRole.ACTIVE)
    assert {object_ref(m) for m in up.create} == set(down.delete)
    assert up.delete == ()


# -- names -----------------------------------------------------------------------------------

def test_the_name_limit_is_the_statefulsets() -> None:
    assert STATEFUL_SET_NAME_MAX == 52
    assert MAX_CELL_AND_REGION == 43
    longest = site_names("c" * 35, "r" * 8)
    assert len(longest.database) == 52
    assert len(f"{longest.database}-{'h' * 10}") == 63  # controller-revision-hash
    with pytest.raises(ValueError, match="at most 43.*52.*controller-revision-hash"):
        site_names("c" * 36, "r" * 8)
    with pytest.raises(ValueError, match="at most 43"):
        replace(ACTIVE, cell="c" * 40)


@pytest.mark.parametrize("cell", ["C1", "-c1", "c1-", "c_1", "c.1", ""])
def test_names_that_are_not_dns_labels_are_refused(cell: str) -> None:
    with pytest.raises(ValueError, match="not a DNS label"):
        site_names(cell, "region-a")


_label = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?\Z")


@given(cell=_label, region=_label)
def test_every_derived_name_is_valid_or_refused(cell: str, region: str) -> None:
    if len(cell) + len(region) > MAX_CELL_AND_REGION:
        with pytest.raises(ValueError):
            site_names(cell, region)
        return
    names = site_names(cell, region)
    dns_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    for service in (names.database, names.pods, names.agent, names.api):
        assert dns_1035.match(service) and len(service) <= 63
    assert len(names.database) <= STATEFUL_SET_NAME_MAX


def test_sites_of_other_cells_and_regions_share_no_name() -> None:
    def refs(cell: str, region: str) -> set[tuple[str, str]]:
        return {(r.kind, r.name) for r in site_object_refs(cell, region, NAMESPACE, claims=True)}
    assert not refs("c1", "region-a") & refs("c1", "region-b")
    assert not refs("c1", "region-a") & refs("c2", "region-a")


def test_deletion_lists_every_object_the_site_can_have() -> None:
    rendered = {object_ref(m) for m in site_objects(ACTIVE)}
    listed = set(site_object_refs("c1", "region-a", NAMESPACE, claims=False))
    assert rendered == listed
    with_claims = set(site_object_refs("c1", "region-a", NAMESPACE, claims=True)) - listed
    assert {(r.kind, r.name) for r in with_claims} == {
        ("PersistentVolumeClaim", "data-cell-c1-region-a-db-0")}


# -- owners and determinism ------------------------------------------------------------------

def test_every_object_is_owned_by_the_cell() -> None:
    for manifest in site_objects(ACTIVE):
        assert manifest["metadata"]["namespace"] == NAMESPACE
        assert manifest["metadata"]["ownerReferences"] == [{
            "apiVersion": API_VERSION, "kind": "Cell", "name": "c1", "uid": "0b6f3c2e-uid",
            "controller": True, "blockOwnerDeletion": False}]
    with pytest.raises(ValueError, match="uid"):
        replace(ACTIVE, cell_uid="")


def test_rendering_is_deterministic() -> None:
    first = json.dumps(site_objects(ACTIVE))
    again = json.dumps(site_objects(replace(ACTIVE)))
    assert first == again
    assert json.dumps(site_objects(STANDBY)) != json.dumps(
        site_objects(replace(STANDBY, region="region-c")))


def test_exported_members() -> None:
    """Every public class and function of the two modules is in __all__, and every name
    there exists (httpx's rule)."""
    import inspect

    from cellplane_operator.domain import site_names, site_objects
    for module in (site_names, site_objects):
        public = {name for name, value in vars(module).items()
                  if not name.startswith("_")
                  and (inspect.isclass(value) or inspect.isfunction(value))
                  and getattr(value, "__module__", None) == module.__name__}
        assert public <= set(module.__all__), module.__name__
        assert all(hasattr(module, name) for name in module.__all__), module.__name__
