"""What a cluster's StorageClasses can give the checkpoint claim, checked before `submit`.

A StorageClass has no access-mode field: what a class offers is its provisioner's (the CSI
driver's) capability. The table below is read from each driver's documentation; a provisioner
not in it is reported as unknown, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
RWO = ("ReadWriteOnce", "ReadWriteOncePod")
RWX = ("ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany")
# provisioner -> access modes it offers (block/disk drivers attach to one node at a time)
PROVISIONER_MODES: dict[str, tuple[str, ...]] = {
    "ebs.csi.aws.com": RWO,  # EKS gp2/gp3
    "kubernetes.io/aws-ebs": RWO,
    "pd.csi.storage.gke.io": RWO,  # GKE standard-rwo, premium-rwo
    "kubernetes.io/gce-pd": RWO,
    "disk.csi.azure.com": RWO,  # AKS managed-csi
    "kubernetes.io/azure-disk": RWO,
    "rancher.io/local-path": RWO,  # kind `standard`, k3s `local-path`
    "kubernetes.io/no-provisioner": RWO,  # local volumes
    "csi.vsphere.vmware.com": RWO,
    "efs.csi.aws.com": RWX,
    "filestore.csi.storage.gke.io": RWX,
    "file.csi.azure.com": RWX,  # AKS azurefile-csi
    "kubernetes.io/azure-file": RWX,
    "nfs.csi.k8s.io": RWX,
    "cephfs.csi.ceph.com": RWX,
    "fsx.csi.aws.com": RWX,
}


@dataclass(frozen=True)
class ClaimNeed:
    """A claim the job creates: its name, the class it names ("" = the default), its modes."""

    name: str
    storage_class: str
    access_modes: tuple[str, ...]


def claims_of(docs: list[dict]) -> list[ClaimNeed]:
    found = []
    for doc in docs:
        if doc.get("kind") != "PersistentVolumeClaim" or doc.get("apiVersion") != "v1":
            continue
        spec = doc.get("spec") or {}
        found.append(
            ClaimNeed(
                str((doc.get("metadata") or {}).get("name")),
                str(spec.get("storageClassName") or ""),
                tuple(spec.get("accessModes") or ()),
            )
        )
    return found


def _is_default(item: dict) -> bool:
    annotations = (item.get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(DEFAULT_CLASS_ANNOTATION, "")).lower() == "true"


class StorageProblem(ValueError):
    """The claim cannot be satisfied by the cluster's storage: one line with the fix."""


def check_claim(claim: ClaimNeed, classes: list[dict]) -> str:
    """A line saying what the class offers; StorageProblem when the claim would stay Pending."""
    by_name = {(c.get("metadata") or {}).get("name"): c for c in classes}
    if claim.storage_class:
        item = by_name.get(claim.storage_class)
        if item is None:
            known = ", ".join(sorted(str(n) for n in by_name)) or "none"
            raise StorageProblem(
                f"claim {claim.name} names StorageClass {claim.storage_class}, which the cluster "
                f"does not have (it has: {known}); the claim and every pod would stay Pending. "
                "Give --storage-class one of those"
            )
        which = f"StorageClass {claim.storage_class}"
    else:
        defaults = [c for c in classes if _is_default(c)]
        if not defaults:
            raise StorageProblem(
                f"claim {claim.name} asks for the default StorageClass, but the cluster has "
                "none; the claim and every pod would stay Pending. Give --storage-class NAME, "
                "or --checkpoint-pvc with a claim you made"
            )
        item = defaults[0]
        which = f"the default StorageClass {(item.get('metadata') or {}).get('name')}"
    provisioner = str(item.get("provisioner", ""))
    offers = PROVISIONER_MODES.get(provisioner)
    wanted = ", ".join(claim.access_modes)
    if offers is None:
        return (
            f"{which} ({provisioner}) is not one kubeddp knows: it cannot tell whether it offers "
            f"{wanted}; if the claim stays Pending, see docs/checkpoints.md"
        )
    missing = [mode for mode in claim.access_modes if mode not in offers]
    if missing:
        raise StorageProblem(
            f"claim {claim.name} asks for {', '.join(missing)} but {which} ({provisioner}) "
            f"offers {', '.join(offers)} only: the claim and every pod would stay Pending. Leave "
            "--checkpoint-storage and --checkpoint-access-mode unset (a keeper pod holds a "
            "ReadWriteOnce claim), or give --storage-class a ReadWriteMany class"
        )
    return f"{which} ({provisioner}) offers {wanted}"
