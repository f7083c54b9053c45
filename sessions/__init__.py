"""How the onnxruntime sessions of a split model are made and run (installed as ``lazybatch.sessions``).

The layer below the Triton backend (``lazybatch.backend``) and the offline tools (``lazybatch.onnx_tools``: export,
split, verify, profile), which both run stage sessions the same way: ``threads`` (one intra-op pool per process or
per session), ``arena`` (one CPU arena per process or per session), ``inplace`` (residual stages that write over
their input), ``ort_optimize`` (optimise-then-split and the host check its stages need), ``segments`` (consecutive
stages merged into one graph), ``chain`` (``StageChain``: the whole graph and the chained stages of a split folder).
onnx and onnxruntime are imported where used, so that importing this package costs nothing; it imports nothing of
lazybatch above ``lazybatch.batcher``.
"""
