"""Shale's Python package.

Today it holds the code generated from Shale's protocol (``make proto``):
``shale.v1`` (the messages and gRPC stubs of proto/shale/v1: KV, Admin,
Auth) and ``shale.rpc`` (wire-compatible ``google.rpc.Status`` and
``ErrorInfo``, to read error details). It runs on Debian's python3-grpcio
(1.51) and python3-protobuf (4.21); examples/python/error_details.py shows
how a plain gRPC program reads Shale's typed errors. The client (routing,
retries, leader following) is the Go SDK's today; see docs/api.md.
"""
