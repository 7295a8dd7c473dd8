"""Generated protobuf and gRPC modules for cdcflow's .proto files (scripts/gen-protos). Do not edit."""
