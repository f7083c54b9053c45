"""The arbiter: one process per device group that owns a ``SharedDevice`` (batcher/device.py) for the lazybatch
models one tritonserver co-locates (config.pbtxt ``device_group``). Triton runs each model instance in a stub process
of its own, so the device's decisions must live outside every stub: ``server.py`` is that process, ``client.py`` the
gate a stub's ``Scheduler`` asks, ``protocol.py`` the few bytes they exchange (docs/colocation.md, "Served: the
arbiter")."""
