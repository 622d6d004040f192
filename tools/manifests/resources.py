"""Where objects of each kind live in the Kubernetes REST API (the job kinds add their own)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    kind: str
    group: str  # "" for the core group
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """`apiVersion/kind`, how documents are matched to resources and schemas."""
        return f"{self.api_version}/{self.kind}"

    @property
    def full_name(self) -> str:
        """plural.group, e.g. pytorchjobs.kubeflow.org (also the CRD's name)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def collection_path(self, namespace: str) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}"


CONFIG_MAP = Resource("ConfigMap", "", "v1", "configmaps")
PERSISTENT_VOLUME_CLAIM = Resource("PersistentVolumeClaim", "", "v1", "persistentvolumeclaims")
SERVICE = Resource("Service", "", "v1", "services")
POD = Resource("Pod", "", "v1", "pods")
SERVICE_ACCOUNT = Resource("ServiceAccount", "", "v1", "serviceaccounts")
ROLE = Resource("Role", "rbac.authorization.k8s.io", "v1", "roles")
ROLE_BINDING = Resource("RoleBinding", "rbac.authorization.k8s.io", "v1", "rolebindings")
POD_MONITOR = Resource("PodMonitor", "monitoring.coreos.com", "v1", "podmonitors")
DEPLOYMENT = Resource("Deployment", "apps", "v1", "deployments")  # the checkpoint keeper
SECRET = Resource("Secret", "", "v1", "secrets")  # the checkpoint keeper's <job>-keeper-token
# who may reach the checkpoint keeper: the job's pods only
NETWORK_POLICY = Resource("NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies")
# The runtime kubeddp renders beside a TrainJob (trainJob.ownRuntime), named after the job.
TRAINING_RUNTIME = Resource(
    "TrainingRuntime", "trainer.kubeflow.org", "v1alpha1", "trainingruntimes"
)
# The objects `kubeddp submit` creates beside a job, in apply order: what the job needs before it
# starts, then (after the job) what watches it. The job kinds are in tools/manifests/kinds.
APPLY_FIRST = (
    SERVICE_ACCOUNT,
    CONFIG_MAP,
    SECRET,
    PERSISTENT_VOLUME_CLAIM,
    SERVICE,
    NETWORK_POLICY,
    DEPLOYMENT,
    TRAINING_RUNTIME,
)
APPLY_LAST = (POD_MONITOR,)
# The objects beside a job that kubeddp renders, submits or reads.
COMPANION_RESOURCES = (
    CONFIG_MAP,
    SECRET,
    PERSISTENT_VOLUME_CLAIM,
    SERVICE,
    NETWORK_POLICY,
    DEPLOYMENT,
    POD,
    SERVICE_ACCOUNT,
    ROLE,
    ROLE_BINDING,
    POD_MONITOR,
    TRAINING_RUNTIME,
)
