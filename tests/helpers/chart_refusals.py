"""Chart values that real Helm must refuse: the schema's rejections (values.schema.json) and
the template rules (`fail` in the templates), each with what the message must say. The library
render (tests/unit/test_chart_schema.py) and the helm binaries
(tests/unit/test_chart_helm_cli.py) check the same cases."""

from __future__ import annotations

SCHEMA_REJECTS = {
    # case: (values, texts the message must contain)
    "wrong type": ({"nodes": "two"}, ["/nodes", "got string, want null or integer"]),
    "nodes < 1": ({"nodes": 0}, ["/nodes", "minimum: got 0, want 1"]),
    "nodes above int32": ({"nodes": 2**31}, ["/nodes", "maximum"]),
    "env of kubeddp's own": ({"env": {"KUBEDDP_NNODES": "9"}}, ["propertyName 'KUBEDDP_NNODES'"]),
    "env of torchrun's own": ({"env": {"LOCAL_RANK": "3"}}, ["propertyName 'LOCAL_RANK'"]),
    "env PATH": ({"env": {"PATH": "/x"}}, ["propertyName 'PATH'"]),
    "extraEnv of the operator's own": (
        {"extraEnv": [{"name": "PET_NNODES", "value": "9"}]},
        ["/extraEnv/0"],
    ),
    "extraEnv bad name": ({"extraEnv": [{"name": "1BAD", "value": "9"}]}, ["/extraEnv/0"]),
    "extraEnv bad secret name": (
        {
            "extraEnv": [
                {"name": "A", "valueFrom": {"secretKeyRef": {"name": "Bad_Name", "key": "k"}}}
            ]
        },
        ["/extraEnv/0"],
    ),
    "extraEnv bad secret key": (
        {
            "extraEnv": [
                {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "bad key!"}}}
            ]
        },
        ["/extraEnv/0"],
    ),
    "volume claim name": (
        {
            "volumes": [
                {"name": "d", "mountPath": "/d", "persistentVolumeClaim": {"claimName": "Data"}}
            ]
        },
        ["/volumes/0"],
    ),
    "volume mount path too long": (
        {"volumes": [{"name": "d", "mountPath": "/" + "a" * 5000, "emptyDir": {}}]},
        ["/volumes/0/mountPath", "maxLength"],
    ),
    "fabric not a profile": ({"network": {"fabric": "ib"}}, ["/network/fabric", "'roce'"]),
    "fabric resource not a resource name": (
        {"network": {"fabric": "roce", "deviceResource": "ib"}},
        ["/network/deviceResource", "does not match pattern"],
    ),
    "no fabric devices": ({"network": {"devices": 0}}, ["/network/devices", "minimum"]),
    "pod security level unknown": ({"podSecurityLevel": "open"}, ["/podSecurityLevel"]),
    "topology key not a label key": (
        {"placement": {"topologyKey": "a block"}},
        ["/placement/topologyKey", "does not match pattern"],
    ),
    "placement mode unknown": (
        {"placement": {"topologyKey": "rack", "mode": "soft"}},
        ["/placement/mode"],
    ),
    "unknown key": ({"node": 2}, ["additional properties 'node' not allowed"]),
    "unknown nested key": (
        {"elastic": {"enabled": True, "minNode": 1}},
        ["/elastic", "'minNode' not allowed"],
    ),
    "bad job name": (
        {"fullnameOverride": "My_Job"},
        ["/fullnameOverride", "'My_Job' does not match pattern"],
    ),
    "job name too long": (
        {"fullnameOverride": "a" * 41},
        ["/fullnameOverride", "maxLength: got 41, want 40"],
    ),
    "unknown kind": (
        {"kind": "MPIJob"},
        ["/kind", "'auto', 'PyTorchJob', 'TrainJob', 'IndexedJob'"],
    ),
    "time limit in days": ({"timeLimit": "2d"}, ["/timeLimit"]),
    "time limit of minutes before hours": ({"timeLimit": "30m1h"}, ["/timeLimit"]),
    "time limit negative": ({"timeLimit": -60}, ["/timeLimit"]),
    "bad pull policy": ({"image": {"pullPolicy": "Sometimes"}}, ["/image/pullPolicy"]),
    "bad nproc word": ({"nprocPerNode": "many"}, ["/nprocPerNode", "'many'"]),
    "zero nproc": ({"nprocPerNode": 0}, ["/nprocPerNode"]),
    "negative gpus": ({"gpusPerNode": -1}, ["/gpusPerNode", "minimum"]),
    "bad quantity": ({"shmSize": "lots"}, ["/shmSize", "'lots' does not match pattern"]),
    "bad resource quantity": (
        {"resources": {"requests": {"cpu": "4 cores"}}},
        ["/resources/requests/cpu"],
    ),
    "bad restart policy": ({"restartPolicy": "Sometimes"}, ["/restartPolicy", "'ExitCode'"]),
    "bad gang scheduler": ({"gang": {"scheduler": "yunikorn"}}, ["/gang/scheduler"]),
    "bad queue name": ({"kueue": {"queueName": "Team A"}}, ["/kueue/queueName"]),
    "toleration typo": ({"tolerations": [{"keyy": "a"}]}, ["/tolerations/0", "'keyy' not allowed"]),
    "affinity typo": ({"affinity": {"nodeAfinity": {}}}, ["/affinity", "'nodeAfinity'"]),
    "security context type": (
        {"securityContext": {"runAsUser": "root"}},
        ["/securityContext/runAsUser"],
    ),
    "trainer config typo": (
        {"config": {"train": {"lrr": 0.1}}},
        ["/config/train", "'lrr' not allowed"],
    ),
    "trainer config type": (
        {"config": {"train": {"epochs": "3"}}},
        ["/config/train/epochs", "got string, want integer"],
    ),
    "trainer config choice": (
        {"config": {"ddp": {"backend": "mpi"}}},
        ["/config/ddp/backend", "'nccl'"],
    ),
    "trainer config minimum": (
        {"config": {"train": {"batch_size": 0}}},
        ["/config/train/batch_size", "minimum"],
    ),
    "trainer config maximum": (
        {"config": {"metrics": {"port": 70000}}},
        ["/config/metrics/port", "maximum"],
    ),
    "trainer config timeout 0": (
        {"config": {"ddp": {"timeout_seconds": 0}}},
        ["/config/ddp/timeout_seconds", "exclusiveMinimum"],
    ),
    "custom workload without factories": (
        {"config": {"workload": {"name": "custom"}}},
        ["/config/workload", "missing properties 'model', 'data'"],
    ),
    "bad image digest": ({"image": {"digest": "sha256:xyz"}}, ["/image/digest"]),
    "bad namespace": ({"namespaceOverride": "Team"}, ["/namespaceOverride"]),
    "bad managedBy": ({"managedBy": "Flux"}, ["/managedBy"]),
    "bad env name": ({"env": {"1X": "a"}}, ["'1X' does not match pattern"]),
    "env value not a string": ({"env": {"A": 1}}, ["/env/A", "got number, want string"]),
    "bad podmonitor label": (
        {"monitoring": {"podMonitor": {"labels": {"release": "a b"}}}},
        ["/monitoring/podMonitor/labels/release"],
    ),
    "volume over /dev/shm": (
        {"volumes": [{"name": "data", "mountPath": "/dev/shm", "emptyDir": {}}]},
        ["/volumes/0/mountPath", "'not' failed"],
    ),
    "volume inside the checkpoints": (
        {"volumes": [{"name": "data", "mountPath": "/checkpoints/x", "emptyDir": {}}]},
        ["/volumes/0/mountPath"],
    ),
    "volume over the venv's parent": (
        {"volumes": [{"name": "data", "mountPath": "/opt", "emptyDir": {}}]},
        ["/volumes/0/mountPath", "'not' failed"],
    ),
    "volume at a relative path": (
        {"volumes": [{"name": "data", "mountPath": "data", "emptyDir": {}}]},
        ["/volumes/0/mountPath", "'data' does not match pattern"],
    ),
    "volume named like kubeddp's": (
        {"volumes": [{"name": "dshm", "mountPath": "/data", "emptyDir": {}}]},
        ["/volumes/0/name"],
    ),
    "bad volume name": (
        {"volumes": [{"name": "Data_Set", "mountPath": "/data", "emptyDir": {}}]},
        ["/volumes/0/name", "'Data_Set' does not match pattern"],
    ),
    "hostPath volume": (
        {"volumes": [{"name": "data", "mountPath": "/data", "hostPath": {"path": "/"}}]},
        ["/volumes/0", "'hostPath' not allowed"],
    ),
    "envFrom typo": ({"envFrom": [{"secretRefs": {"name": "s"}}]}, ["/envFrom/0"]),
    "bad module name": ({"trainer": {"module": "my-train"}}, ["/trainer/module"]),
    "program args not strings": ({"trainer": {"args": [3]}}, ["/trainer/args/0"]),
}

FAIL_RULES = {
    # case: (values, release name, pattern of the message)
    "time limit of no time": (
        {"timeLimit": "0h0m"},
        "demo",
        r"`timeLimit` 0h0m is under one second",
    ),
    "kind auto refuses as the kind it picked": (  # no cluster here: an Indexed Job
        {"elastic": {"enabled": True}},
        "demo",
        r"cannot be set for kind IndexedJob \(picked by kind auto: set `kind` to choose\)",
    ),
    "job name from release": ({}, "9lives", r'job name "9lives-kubeddp" .*is not a DNS-1035'),
    "job name too long": ({}, "a" * 45, r"at most 40 characters"),
    "more processes than GPUs": (
        {"gpusPerNode": 2, "nprocPerNode": 4},
        "demo",
        r"`nprocPerNode` is 4 but `gpusPerNode` is 2",
    ),
    "elastic min > max": (
        {"kind": "PyTorchJob", "elastic": {"enabled": True, "minNodes": 4, "maxNodes": 2}},
        "demo",
        r"`elastic.minNodes` \(4\) is greater than `elastic.maxNodes` \(2\)",
    ),
    "nodes outside elastic": (
        {"kind": "PyTorchJob", "nodes": 5, "elastic": {"enabled": True, "maxNodes": 4}},
        "demo",
        r"`nodes` \(5\) is outside `elastic.minNodes`..`elastic.maxNodes`",
    ),
    "elastic with TrainJob": (
        {"kind": "TrainJob", "elastic": {"enabled": True}},
        "demo",
        r"`elastic.enabled` \(true\) cannot be set for kind TrainJob: its node count is fixed",
    ),
    "elastic with IndexedJob": (
        {"kind": "IndexedJob", "elastic": {"enabled": True}},
        "demo",
        r"`elastic.enabled` \(true\) cannot be set for kind IndexedJob",
    ),
    "gang with IndexedJob": (
        {"kind": "IndexedJob", "gang": {"scheduler": "volcano"}},
        "demo",
        r"`gang.scheduler` \(volcano\) cannot be set for kind IndexedJob: use `kueue.queueName`",
    ),
    "cleanPodPolicy with TrainJob": (
        {"kind": "TrainJob", "cleanPodPolicy": "All"},
        "demo",
        r"`cleanPodPolicy` \(All\) cannot be set for kind TrainJob",
    ),
    "restartPolicy with TrainJob": (
        {"kind": "TrainJob", "restartPolicy": "Never"},
        "demo",
        r"`restartPolicy` \(Never\) cannot be set for kind TrainJob: Trainer v2.3 runtimePatches",
    ),
    "backoffLimit with TrainJob on an installed runtime": (
        {"kind": "TrainJob", "backoffLimit": 0, "trainJob": {"ownRuntime": False}},
        "demo",
        r"`backoffLimit` cannot be set for kind TrainJob with `trainJob.ownRuntime` false",
    ),
    "ttl with TrainJob": (
        {"kind": "TrainJob", "ttlSecondsAfterFinished": 60},
        "demo",
        r"`ttlSecondsAfterFinished` \(60\) cannot be set for kind TrainJob",
    ),
    "priorityClass with TrainJob": (
        {"kind": "TrainJob", "priorityClassName": "high"},
        "demo",
        r"`priorityClassName` \(high\) cannot be set for kind TrainJob",
    ),
    "nproc word with TrainJob": (
        {"kind": "TrainJob", "nprocPerNode": "gpu"},
        "demo",
        r'`nprocPerNode` "gpu" is not valid for kind TrainJob: use a count, or one of auto',
    ),
    "Always with IndexedJob": (
        {"kind": "IndexedJob", "restartPolicy": "Always"},
        "demo",
        r"`restartPolicy` Always is not valid for kind IndexedJob: use one of ExitCode",
    ),
    "claim and size": (
        {"checkpoints": {"existingClaim": "ckpt", "size": "10Gi"}},
        "demo",
        r"`checkpoints.existingClaim` \(ckpt\) and `checkpoints.size` \(10Gi\) are both set: "
        r"the size is for the claim kubeddp creates",
    ),
    "lost on retry with a storage class": (
        {"checkpoints": {"lostOnRetry": True, "storageClassName": "fast"}},
        "demo",
        r"`checkpoints.lostOnRetry` and `checkpoints.storageClassName` \(fast\) are both set",
    ),
    "lost on retry with an existing claim": (
        {"checkpoints": {"lostOnRetry": True, "existingClaim": "ckpt"}},
        "demo",
        r"`checkpoints.existingClaim` \(ckpt\) and `checkpoints.lostOnRetry` are both set",
    ),
    "master replica with elastic": (
        {"kind": "PyTorchJob", "pytorchJob": {"masterReplica": True}, "elastic": {"enabled": True}},
        "demo",
        r"`pytorchJob.masterReplica` and `elastic.enabled` are both set: an elastic PyTorchJob "
        r"has Workers only",
    ),
    "podmonitor labels without podmonitor": (
        {"monitoring": {"podMonitor": {"labels": {"release": "x"}}}},
        "demo",
        r"`monitoring.podMonitor.labels` is set but `monitoring.podMonitor.enabled` is false",
    ),
    "podmonitor interval without podmonitor": (
        {"monitoring": {"podMonitor": {"interval": "15s"}}},
        "demo",
        r"`monitoring.podMonitor.interval` is set but",
    ),
    "script and module": (
        {"trainer": {"script": "/app/train.py", "module": "train"}},
        "demo",
        r"`trainer.script` \(/app/train.py\) and `trainer.module` \(train\) are both set",
    ),
    "program args without a program": (
        {"trainer": {"args": ["--epochs", "3"]}},
        "demo",
        r"`trainer.args` is set but neither `trainer.script` nor `trainer.module`",
    ),
    "spawning program flag without a program": (
        {"trainer": {"spawnsWorkers": True}},
        "demo",
        r"`trainer.spawnsWorkers` is true but neither `trainer.script` nor `trainer.module`",
    ),
    "spawning program on several nodes": (
        {"trainer": {"script": "/app/spawn.py", "spawnsWorkers": True}, "nodes": 2},
        "demo",
        r"`trainer.spawnsWorkers` is true: .* each of the 2 nodes would train its own copy",
    ),
    "built-in trainer config with a program": (
        {"trainer": {"module": "train"}, "config": {"train": {"epochs": 3}}},
        "demo",
        r"`config.train.epochs` is set but `trainer.module` runs your own program",
    ),
    "volume without a source": (
        {"volumes": [{"name": "data", "mountPath": "/data"}]},
        "demo",
        r"`volumes` entry data has no source: give one of persistentVolumeClaim",
    ),
    "volume with two sources": (
        {"volumes": [{"name": "d", "mountPath": "/d", "emptyDir": {}, "secret": {}}]},
        "demo",
        r"`volumes` entry d has 2 sources \(",
    ),
    "two volumes of one name": (
        {
            "volumes": [
                {"name": "d", "mountPath": "/a", "emptyDir": {}},
                {"name": "d", "mountPath": "/b", "emptyDir": {}},
            ]
        },
        "demo",
        r"`volumes` has two entries named d",
    ),
    "two volumes at one path": (
        {
            "volumes": [
                {"name": "a", "mountPath": "/data", "emptyDir": {}},
                {"name": "b", "mountPath": "/data", "emptyDir": {}},
            ]
        },
        "demo",
        r"`volumes` mounts two volumes at /data",
    ),
    "envFrom with TrainJob": (
        {"kind": "TrainJob", "envFrom": [{"secretRef": {"name": "s3"}}]},
        "demo",
        r'`envFrom` \(\[\{"secretRef":\{"name":"s3"\}\}\]\) cannot be set for kind TrainJob',
    ),
    "extraEnv name twice": (
        {"extraEnv": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
        "demo",
        r"`extraEnv` has A twice",
    ),
    "extraEnv name also in env": (
        {"env": {"A": "1"}, "extraEnv": [{"name": "A", "value": "2"}]},
        "demo",
        r"`extraEnv` entry A is also set in `env`",
    ),
    "checkpoints storage with lostOnRetry": (
        {"checkpoints": {"storage": "keeper", "lostOnRetry": True}},
        "demo",
        r"`checkpoints.storage` \(keeper\) and `checkpoints.lostOnRetry` are both set",
    ),
    "ReadWriteOncePod mounted by several pods": (
        {"nodes": 3, "checkpoints": {"accessMode": "ReadWriteOncePod", "storage": "mount"}},
        "demo",
        r"ReadWriteOncePod with 3 pods .* admits one pod in the whole cluster",
    ),
    "ReadWriteOnce mounted by several pods": (
        {"nodes": 2, "checkpoints": {"accessMode": "ReadWriteOnce", "storage": "mount"}},
        "demo",
        r"ReadWriteOnce with 2 pods .* Multi-Attach; leave `checkpoints.storage` unset",
    ),
    "relative checkpoint dir": (
        {"config": {"checkpoint": {"dir": "ck"}}},
        "demo",
        r'`config.checkpoint.dir` "ck" is not an absolute, clean path',
    ),
    "checkpoint dir on a path the pod needs": (
        {"config": {"checkpoint": {"dir": "/etc"}}},
        "demo",
        r"`config.checkpoint.dir` /etc would put the checkpoints volume on or over /etc/kubeddp",
    ),
    "checkpoint dir on a user's volume": (
        {
            "config": {"checkpoint": {"dir": "/data/ck"}},
            "volumes": [
                {"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "d"}}
            ],
        },
        "demo",
        r"`config.checkpoint.dir` /data/ck lies on the volume data mounted at /data",
    ),
    "an object store's scheme without its //": (
        {"config": {"checkpoint": {"dir": "S3:/bkt/run"}}},
        "demo",
        r'`config.checkpoint.dir` "S3:/bkt/run" names object storage \(s3\) but does not start '
        r"with s3://: write s3://BUCKET/PREFIX",
    ),
    "a claim setting with s3 checkpoints": (
        {"config": {"checkpoint": {"dir": "s3://bkt/run"}}, "checkpoints": {"size": "5Gi"}},
        "demo",
        r"`checkpoints.size` is set but `config.checkpoint.dir` is s3://bkt/run: S3 checkpoints",
    ),
    "dashboard labels without dashboard": (
        {"monitoring": {"dashboard": {"labels": {"team": "ml"}}}},
        "demo",
        r"`monitoring.dashboard.labels` is set but `monitoring.dashboard.enabled` is false",
    ),
    # network.fabric and placement (templates/_network.tpl)
    "fabric devices on socket": (
        {"network": {"devices": 2}},
        "demo",
        r"`network.deviceResource`/`network.devices` are set but `network.fabric` socket requests",
    ),
    "instance type without efa": (
        {"network": {"fabric": "roce", "deviceResource": "rdma/ib", "instanceType": "p5.48xlarge"}},
        "demo",
        r"`network.instanceType` \(p5.48xlarge\) gives efa its device count, but `network.fabric`",
    ),
    "rdma fabric without its resource": (
        {"network": {"fabric": "infiniband"}},
        "demo",
        r"`network.deviceResource` is empty but `network.fabric` infiniband needs your RDMA",
    ),
    "efa on an instance type not listed": (
        {"network": {"fabric": "efa", "instanceType": "p5en.48xlarge"}},
        "demo",
        r"`network.instanceType` p5en.48xlarge: its EFA count is not in kubeddp's list .*"
        r"set `network.devices`",
    ),
    "hostNetwork with TrainJob": (
        {"kind": "TrainJob", "network": {"fabric": "hostNetwork"}},
        "demo",
        r"`network.fabric` hostNetwork cannot be set for kind TrainJob",
    ),
    "placement mode without its key": (
        {"placement": {"mode": "preferred"}},
        "demo",
        r"`placement.mode` is preferred but `placement.topologyKey` is empty",
    ),
    "fabric above the namespace's Pod Security level": (
        {
            "network": {"fabric": "roce", "deviceResource": "rdma/ib"},
            "podSecurityLevel": "baseline",
        },
        "demo",
        r"`network.fabric` roce needs Pod Security level privileged \(the container adds "
        r"IPC_LOCK .*\) but `podSecurityLevel` says the namespace enforces baseline",
    ),
}
