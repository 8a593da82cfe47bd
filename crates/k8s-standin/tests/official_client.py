"""Drives the stand-in with the official Kubernetes Python client (Debian's
python3-kubernetes), so that the stand-in is checked against a real
client's expectations rather than only against our own.

Usage: official_client.py URL TOKEN CA_FILE. Exits non-zero on the first
mismatch.
"""
import datetime
import sys

from kubernetes import client
from kubernetes.client.rest import ApiException

url, token, ca = sys.argv[1:4]
conf = client.Configuration()
conf.host = url
conf.ssl_ca_cert = ca
conf.api_key = {"authorization": token}
conf.api_key_prefix = {"authorization": "Bearer"}
api = client.ApiClient(conf)
leases = client.CoordinationV1Api(api)
pods = client.CoreV1Api(api)
NS = "mooncake"


def expect_status(code, call, *args):
    try:
        call(*args)
    except ApiException as e:
        assert e.status == code, f"{call.__name__}: {e.status} {e.body}"
        return e
    raise AssertionError(f"{call.__name__}: no {code}")


# A missing lease: 404 NotFound.
expect_status(404, leases.read_namespaced_lease, "missing", NS)

renew = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc)
lease = client.V1Lease(
    metadata=client.V1ObjectMeta(name="leader"),
    spec=client.V1LeaseSpec(
        holder_identity="10.0.0.1:50051",
        lease_duration_seconds=5,
        lease_transitions=0,
        acquire_time=renew,
        renew_time=renew,
    ),
)
created = leases.create_namespaced_lease(NS, lease)
assert created.metadata.resource_version, created
assert created.metadata.namespace == NS, created
# Creating it again: 409 AlreadyExists.
e = expect_status(409, leases.create_namespaced_lease, NS, lease)
assert "AlreadyExists" in e.body, e.body

got = leases.read_namespaced_lease("leader", NS)
assert got.spec.holder_identity == "10.0.0.1:50051", got
assert got.spec.renew_time == renew, got.spec.renew_time
assert got.metadata.resource_version == created.metadata.resource_version

# A compare-and-swap that wins, then the same stale version: 409 Conflict.
got.spec.holder_identity = "10.0.0.2:50051"
got.spec.lease_transitions = 1
replaced = leases.replace_namespaced_lease("leader", NS, got)
assert replaced.metadata.resource_version != got.metadata.resource_version
e = expect_status(409, leases.replace_namespaced_lease, "leader", NS, got)
assert "Conflict" in e.body, e.body

# A PUT without resourceVersion: 422 Invalid.
replaced.metadata.resource_version = None
e = expect_status(422, leases.replace_namespaced_lease, "leader", NS, replaced)
assert "must be specified for an update" in e.body, e.body

final = leases.read_namespaced_lease("leader", NS)
assert final.spec.holder_identity == "10.0.0.2:50051", final
assert final.spec.lease_transitions == 1, final

# Pod labels: the client sends a dict patch as a strategic merge patch;
# None removes the label.
role = "mooncake.io/store-role"
pods.patch_namespaced_pod("master-0", NS, {"metadata": {"labels": {role: "leader"}}})
assert pods.read_namespaced_pod("master-0", NS).metadata.labels[role] == "leader"
pods.patch_namespaced_pod("master-0", NS, {"metadata": {"labels": {role: None}}})
assert role not in pods.read_namespaced_pod("master-0", NS).metadata.labels

# A wrong token: 401.
conf.api_key = {"authorization": "wrong"}
expect_status(401, leases.read_namespaced_lease, "leader", NS)
print("official client: all checks passed")
