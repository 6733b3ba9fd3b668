"""Generated from proto/shale/v1 by `make proto`: messages (*_pb2) and gRPC stubs (*_pb2_grpc)."""
