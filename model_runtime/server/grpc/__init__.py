"""The daemon's gRPC front end: Triton's ``GRPCInferenceService`` (KServe v2) on grpc.aio."""
