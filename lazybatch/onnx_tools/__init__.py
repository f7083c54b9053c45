"""ONNX side of lazybatch: export the paper's models, split any model into stages, verify and profile them.

Everything here uses onnx and onnxruntime only (no PyTorch), so the default install can export, split and
profile. Modules stay small: ``zoo`` builds graphs, ``split`` cuts them, ``verify`` proves the cut,
``manifest`` describes the result for the Triton backend, ``profile`` measures the latency table.
"""

# onnxruntime 1.31 reads ONNX IR versions up to 13; onnx 1.23 writes 14 by default. Every model we write says 8,
# which covers opsets up to 17 and keeps files readable by older runtimes (the Triton GPU box has ORT 1.30).
IR_VERSION = 8
