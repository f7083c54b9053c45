"""Triton gRPC/HTTP clients and load generators (installed as ``lazybatch.client``)."""
