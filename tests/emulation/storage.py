"""Cluster storage as the emulated cluster sees it: StorageClasses with the access modes their
provisioner offers, claims that bind or stay Pending, and volumes attached to one node.

An independent model (it imports nothing from kubeddp). Its rules, with the upstream code they
follow (rows in operator_table.csv):
- a claim that names no class gets the default StorageClass (admission plugin
  DefaultStorageClass, plugin/pkg/admission/storage/storageclass/setdefault); with none, or with
  a class whose provisioner cannot make the access mode (the CSI external-provisioner refuses
  the volume capability: "ProvisioningFailed ... access mode ... not supported"), the claim
  stays Pending, and so does every pod that mounts it (scheduler VolumeBinding plugin,
  pkg/scheduler/framework/plugins/volumebinding: "pod has unbound immediate
  PersistentVolumeClaims" / "waiting for a volume to be created");
- a ReadWriteOnce volume is attached to one node; a pod on another node waits in
  ContainerCreating with "Multi-Attach error for volume ... Volume is already used by pod(s)"
  (attach/detach controller, pkg/controller/volume/attachdetach/reconciler/reconciler.go
  reportMultiAttachError); it is detached when no pod on that node uses it any more;
- a ReadWriteOncePod claim admits one pod in the whole cluster; another stays Pending
  (scheduler VolumeRestrictions plugin, pkg/scheduler/framework/plugins/volumerestrictions:
  "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access
  mode").
- a zonal disk (EBS, GCE PD, Azure Disk) is provisioned in the zone of the first pod's node and
  the PV's nodeAffinity names that zone (the CSI driver's topology, volumeBindingMode
  WaitForFirstConsumer): every later pod using it is placed in that zone (scheduler
  VolumeBinding plugin, "volume node affinity conflict" elsewhere);
- after the node of a pod using a ReadWriteOnce volume is lost, the volume stays attached to
  it until the attach/detach controller force-detaches it, ReconcilerMaxWaitForUnmountDuration
  (6 min, pkg/controller/volume/attachdetach/attach_detach_controller.go DefaultTimerConfig)
  after the pod's deletion; a new pod elsewhere waits with the Multi-Attach error until then.
A claim a manifest only names (an existing claim) is taken as Bound and ReadWriteMany.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

RWO = ("ReadWriteOnce", "ReadWriteOncePod")
RWX = ("ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany")


@dataclass(frozen=True)
class StorageClass:
    name: str
    provisioner: str
    access_modes: tuple[str, ...]  # what the provisioner can make
    default: bool = False
    zonal: bool = False  # a disk in one zone (the PV's nodeAffinity names it)


# The defaults of the clusters users have (each provider's documentation), and the emulator's
# own default: an NFS-like class that offers every mode (what the emulator assumed before).
KIND_STANDARD = StorageClass("standard", "rancher.io/local-path", RWO, default=True)
EKS_GP3 = StorageClass("gp3", "ebs.csi.aws.com", RWO, default=True, zonal=True)
RWX_NFS = StorageClass("nfs", "nfs.csi.k8s.io", RWX, default=True)


@dataclass
class Claim:
    name: str
    access_modes: tuple[str, ...]
    storage_class: str  # resolved; "" = none
    phase: str = "Bound"  # Bound | Pending
    reason: str = ""  # why Pending
    attached_node: str = ""  # RWO: the node the volume is attached to
    users: dict[str, str] = field(default_factory=dict)  # pod -> node
    zonal: bool = False
    zone: str = ""  # a zonal disk's zone, once provisioned
    held_until: float = 0.0  # time.monotonic() of the force-detach from a lost node


class Storage:
    def __init__(self, classes: list[StorageClass]) -> None:
        self.classes = {c.name: c for c in classes}
        self.claims: dict[str, Claim] = {}

    def add_claim(self, doc: dict[str, Any]) -> Claim:
        spec = doc.get("spec") or {}
        name = doc["metadata"]["name"]
        modes = tuple(spec.get("accessModes") or ())
        wanted = spec.get("storageClassName")
        if wanted is None:
            defaults = [c for c in self.classes.values() if c.default]
            wanted = defaults[0].name if defaults else ""
        storage_class = self.classes.get(wanted)
        claim = Claim(name, modes, wanted, zonal=storage_class is not None and storage_class.zonal)
        if storage_class is None:
            claim.phase = "Pending"
            claim.reason = (
                f'storageclass.storage.k8s.io "{wanted}" not found'
                if wanted
                else "no persistent volumes available and no storage class is set"
            )
        else:
            missing = [m for m in modes if m not in storage_class.access_modes]
            if missing:
                claim.phase = "Pending"
                claim.reason = (
                    f"ProvisioningFailed: {storage_class.provisioner}: access mode "
                    f"{', '.join(missing)} not supported"
                )
        self.claims[name] = claim
        return claim

    def claim(self, name: str) -> Claim:
        if name not in self.claims:  # named by a manifest, made by someone else: Bound
            self.claims[name] = Claim(name, RWX, "")
        return self.claims[name]

    def zone_of(self, claim_names: list[str]) -> str:
        """The zone a pod using these claims must run in ("" = any)."""
        return next((self.claim(n).zone for n in claim_names if self.claim(n).zone), "")

    def blocked(self, pod: str, node: str, claim_names: list[str], zone: str = "") -> str:
        """Why the pod cannot start on `node` (in `zone`) now ("" = its volumes mount)."""
        now = time.monotonic()
        for name in claim_names:
            claim = self.claim(name)
            if claim.phase != "Bound":
                return f'FailedScheduling: pod {pod}: claim "{name}" is Pending ({claim.reason})'
            if claim.zone and zone and zone != claim.zone:
                return f"FailedScheduling: pod {pod}: volume node affinity conflict ({claim.zone})"
            if claim.held_until and now < claim.held_until and claim.attached_node != node:
                return (
                    f'FailedAttachVolume: pod {pod}: Multi-Attach error for volume "{name}" '
                    f"Volume is still attached to the lost node {claim.attached_node} (force-"
                    f"detach in {claim.held_until - now:.0f} s)"
                )
            if claim.held_until and now >= claim.held_until:
                claim.held_until = 0.0  # force-detached
                if not claim.users:
                    claim.attached_node = ""
            others = {p: n for p, n in claim.users.items() if p != pod}
            if "ReadWriteOncePod" in claim.access_modes and others:
                return (
                    f"FailedScheduling: pod {pod}: node has pod using PersistentVolumeClaim "
                    f'"{name}" with the same name and ReadWriteOncePod access mode '
                    f"({', '.join(others)})"
                )
            shared = "ReadWriteMany" in claim.access_modes
            if not shared and others and claim.attached_node not in ("", node):
                return (
                    f'FailedAttachVolume: pod {pod}: Multi-Attach error for volume "{name}" '
                    f"Volume is already used by pod(s) {', '.join(others)} on node "
                    f"{claim.attached_node}"
                )
        return ""

    def attach(self, pod: str, node: str, claim_names: list[str], zone: str = "") -> None:
        for name in claim_names:
            claim = self.claim(name)
            claim.users[pod] = node
            if "ReadWriteMany" not in claim.access_modes:
                claim.attached_node = node
            if claim.zonal and not claim.zone:
                claim.zone = zone  # provisioned where its first pod runs

    def node_lost(self, pod: str, force_detach_at: float) -> None:
        """The pod on a lost node is deleted: its volumes stay attached to that node until
        the force-detach."""
        for claim in self.claims.values():
            if claim.users.pop(pod, None) is not None and claim.attached_node:
                claim.held_until = force_detach_at

    def release(self, pod: str) -> None:
        """The pod is deleted: its claims detach once no pod uses them."""
        for claim in self.claims.values():
            claim.users.pop(pod, None)
            if not claim.users and not claim.held_until:
                claim.attached_node = ""


def claim_names(volumes: list[dict[str, Any]]) -> list[str]:
    return [
        v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
    ]
