"""Generated from clients/python/proto/shale/rpc by `make proto`: wire-compatible google.rpc.Status and ErrorInfo."""
