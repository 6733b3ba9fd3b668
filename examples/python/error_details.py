"""Reads the typed details of Shale's errors with plain gRPC, as any client can.

Puts one key through every node given: the nodes that do not lead the key's
shard answer FAILED_PRECONDITION with a NotLeader detail naming the leader.
Then asks a node for a shard that does not exist: NOT_FOUND with
ShardNotFound. Against `make run`, with the Python that Debian's
python3-grpcio and python3-protobuf are installed for (`make python-deps`):

    PYTHONPATH=clients/python /usr/bin/python3 examples/python/error_details.py \\
        127.0.0.1:7001 127.0.0.1:7002 127.0.0.1:7003
"""

import sys

import grpc
from google.protobuf import text_format

from shale.rpc import status_pb2
from shale.v1 import kv_pb2, kv_pb2_grpc, meta_pb2

# The detail messages this program knows, by type_url. Skip the others:
# new ones may be added.
DETAIL_TYPES = {
    "type.googleapis.com/" + cls.DESCRIPTOR.full_name: cls
    for cls in (
        meta_pb2.NotLeader,
        meta_pb2.EpochMismatch,
        meta_pb2.KeyOutsideShard,
        meta_pb2.ShardNotFound,
        meta_pb2.CrossShardRequest,
        meta_pb2.WatchInterrupted,
    )
}
DETAIL_TYPES["type.googleapis.com/google.rpc.ErrorInfo"] = status_pb2.ErrorInfo


def details(err: grpc.RpcError) -> list:
    """The typed details of a failed call: the grpc-status-details-bin
    trailer is a serialized google.rpc.Status whose details are Anys."""
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            st = status_pb2.Status.FromString(value)
            return [DETAIL_TYPES[d.type_url].FromString(d.value)
                    for d in st.details if d.type_url in DETAIL_TYPES]
    return []


def show(what: str, call) -> None:
    try:
        call()
        print(f"{what}: OK")
    except grpc.RpcError as err:
        print(f"{what}: {err.code().name}: {err.details()}")
        for d in details(err):
            print(f"  {d.DESCRIPTOR.name} {{{text_format.MessageToString(d, as_one_line=True)}}}")


def main(endpoints: list) -> None:
    for ep in endpoints:
        with grpc.insecure_channel(ep) as channel:
            kv = kv_pb2_grpc.KVStub(channel)
            show(f"put via {ep}", lambda: kv.Put(
                kv_pb2.PutRequest(key=b"example/key", value=b"v"), timeout=5))
    with grpc.insecure_channel(endpoints[0]) as channel:
        kv = kv_pb2_grpc.KVStub(channel)
        show(f"get of shard 999999 via {endpoints[0]}", lambda: kv.Get(
            kv_pb2.GetRequest(header=kv_pb2.RequestHeader(shard_id=999999), key=b"example/key"),
            timeout=5))


if __name__ == "__main__":
    main(sys.argv[1:] or ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"])
