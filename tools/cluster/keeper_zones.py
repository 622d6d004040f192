"""What the keeper's claim costs when the keeper's node is lost, said in one line by render
and submit.

A zonal disk (EBS, GCE PD, Azure Disk) writes its zone into the PV's nodeAffinity, so the
keeper can only run in that zone, and after its node dies it comes back only after the
taint-based eviction (the 300 s tolerationSeconds the DefaultTolerationSeconds admission plugin
adds for node.kubernetes.io/unreachable) and the attach/detach controller's force-detach
(ReconcilerMaxWaitForUnmountDuration, 6 min): 11 min or more. Zone-redundant classes avoid the
zone pin; the line names them. A class render cannot read (offline) is said as unknown.
"""

from __future__ import annotations

from typing import Any

from kubeddp.tools.cluster.storage_classes import DEFAULT_CLASS_ANNOTATION, ClaimNeed, claims_of

ZONAL_DISKS = (
    "ebs.csi.aws.com",
    "kubernetes.io/aws-ebs",
    "pd.csi.storage.gke.io",
    "kubernetes.io/gce-pd",
    "disk.csi.azure.com",
    "kubernetes.io/azure-disk",
)
NODE_LOCAL = ("rancher.io/local-path", "kubernetes.io/no-provisioner")
# Shared filesystems: nothing is attached to a node, so no force-detach wait
SHARED = (
    "efs.csi.aws.com",
    "filestore.csi.storage.gke.io",
    "file.csi.azure.com",
    "kubernetes.io/azure-file",
    "nfs.csi.k8s.io",
    "cephfs.csi.ceph.com",
    "fsx.csi.aws.com",
)
EVICTION_SECONDS = 300  # DefaultTolerationSeconds: node.kubernetes.io/unreachable
FORCE_DETACH_SECONDS = 360  # attach/detach controller: ReconcilerMaxWaitForUnmountDuration
COST = (
    f"after the keeper's node is lost it is back only after eviction ({EVICTION_SECONDS} s) "
    f"and force-detach ({FORCE_DETACH_SECONDS // 60} min): "
    f"{(EVICTION_SECONDS + FORCE_DETACH_SECONDS) // 60} min or more, while the training pods wait"
)
OPTIONS = (
    "zone-redundant: GKE regional PD (pd.csi.storage.gke.io, replication-type: regional-pd), "
    "Azure Disk skuName Premium_ZRS or StandardSSD_ZRS; EBS has none (use EFS or FSx with "
    "--storage-class, or checkpoint.dir=s3://...); see docs/checkpoints.md"
)


def zone_redundant(storage_class: dict[str, Any]) -> bool:
    provisioner = str(storage_class.get("provisioner", ""))
    params = {str(k).lower(): str(v) for k, v in (storage_class.get("parameters") or {}).items()}
    if provisioner in ("pd.csi.storage.gke.io", "kubernetes.io/gce-pd"):
        return params.get("replication-type") == "regional-pd"
    if provisioner in ("disk.csi.azure.com", "kubernetes.io/azure-disk"):
        sku = params.get("skuname") or params.get("storageaccounttype") or ""
        return sku.upper().endswith("_ZRS")
    return False


def zone_line(claim: ClaimNeed, storage_class: dict[str, Any] | None) -> str | None:
    """The line for the keeper's claim, or None when its class is zone-redundant or shared.
    `storage_class`: the class object when the cluster was read, else None (unknown)."""
    if storage_class is None:
        which = f"StorageClass {claim.storage_class or '(the cluster default)'}"
        return (
            f"zones: the keeper's claim {claim.name} uses {which}, not read here: if it is a "
            f"zonal disk (EBS, GCE PD, Azure Disk), {COST}; {OPTIONS}"
        )
    provisioner = str(storage_class.get("provisioner", ""))
    name = (storage_class.get("metadata") or {}).get("name")
    which = f"the keeper's claim {claim.name} uses StorageClass {name} ({provisioner})"
    if provisioner in SHARED or zone_redundant(storage_class):
        return None
    if provisioner in NODE_LOCAL:
        return (
            f"zones: {which}, a volume on one node: the keeper runs only there, and the "
            f"checkpoints are lost with that node; {OPTIONS}"
        )
    kind = "a zonal disk" if provisioner in ZONAL_DISKS else "not one kubeddp knows to be zonal"
    return f"zones: {which}, {kind}: {COST}; {OPTIONS}"


def keeper_claims(docs: list[dict]) -> list[str]:
    """Names of the claims the keeper's Deployment mounts."""
    names = []
    for doc in docs:
        if doc.get("kind") != "Deployment":
            continue
        volumes = (((doc.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
            "volumes"
        ) or []
        names += [
            v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
        ]
    return names


def class_of(claim: ClaimNeed, classes: list[dict]) -> dict | None:
    """The class the claim gets: the one it names, else the default (None: none found)."""
    for item in classes:
        meta = item.get("metadata") or {}
        if claim.storage_class and meta.get("name") == claim.storage_class:
            return item
        default = str((meta.get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION, ""))
        if not claim.storage_class and default.lower() == "true":
            return item
    return None


def zone_lines(docs: list[dict], classes: list[dict] | None) -> list[str]:
    """The zone line of each claim the keeper mounts that the job creates; `classes`: the
    cluster's StorageClasses, or None when they were not read (render)."""
    mounted = set(keeper_claims(docs))
    found = []
    for claim in claims_of(docs):
        if claim.name not in mounted:
            continue
        if classes is None:
            line = zone_line(claim, None)
        else:  # a class the cluster lacks: check_claim already refused it
            item = class_of(claim, classes)
            line = zone_line(claim, item) if item is not None else None
        if line is not None:
            found.append(line)
    return found
