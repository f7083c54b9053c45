"""ONNX element types as numpy dtype names and Triton TYPE_* names (the manifest carries both)."""

from __future__ import annotations

from onnx import TensorProto

_TABLE = {
    TensorProto.FLOAT: ("float32", "TYPE_FP32"),
    TensorProto.FLOAT16: ("float16", "TYPE_FP16"),
    TensorProto.BFLOAT16: ("bfloat16", "TYPE_BF16"),
    TensorProto.DOUBLE: ("float64", "TYPE_FP64"),
    TensorProto.INT8: ("int8", "TYPE_INT8"),
    TensorProto.INT16: ("int16", "TYPE_INT16"),
    TensorProto.INT32: ("int32", "TYPE_INT32"),
    TensorProto.INT64: ("int64", "TYPE_INT64"),
    TensorProto.UINT8: ("uint8", "TYPE_UINT8"),
    TensorProto.UINT16: ("uint16", "TYPE_UINT16"),
    TensorProto.UINT32: ("uint32", "TYPE_UINT32"),
    TensorProto.UINT64: ("uint64", "TYPE_UINT64"),
    TensorProto.BOOL: ("bool", "TYPE_BOOL"),
    TensorProto.STRING: ("object", "TYPE_STRING"),
}


def numpy_name(elem_type: int) -> str:
    return _TABLE.get(elem_type, ("unknown", "TYPE_INVALID"))[0]


def triton_name(elem_type: int) -> str:
    return _TABLE.get(elem_type, ("unknown", "TYPE_INVALID"))[1]
