"""Triton datatypes <-> numpy, for the types a Python-backend model can exchange: one table for the backend (the
config's ``TYPE_*`` names) and its clients (the wire's names, the same without the prefix)."""

from __future__ import annotations

import numpy as np

# Triton config data types <-> numpy, for the types a Python-backend model can exchange.
TRITON_TO_NUMPY: dict[str, np.dtype] = {
    "TYPE_BOOL": np.dtype(np.bool_), "TYPE_UINT8": np.dtype(np.uint8), "TYPE_UINT16": np.dtype(np.uint16),
    "TYPE_UINT32": np.dtype(np.uint32), "TYPE_UINT64": np.dtype(np.uint64), "TYPE_INT8": np.dtype(np.int8),
    "TYPE_INT16": np.dtype(np.int16), "TYPE_INT32": np.dtype(np.int32), "TYPE_INT64": np.dtype(np.int64),
    "TYPE_FP16": np.dtype(np.float16), "TYPE_FP32": np.dtype(np.float32), "TYPE_FP64": np.dtype(np.float64),
}
NUMPY_TO_TRITON = {v: k for k, v in TRITON_TO_NUMPY.items()}

# Triton wire datatypes <-> numpy: the config's TYPE_* names without the prefix
DATATYPES: dict[str, np.dtype] = {k.removeprefix("TYPE_"): v for k, v in TRITON_TO_NUMPY.items()}
NP_TO_DATATYPE = {v: k for k, v in DATATYPES.items()}
