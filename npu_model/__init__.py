"""Analytical systolic-array NPU timing model (installed as ``lazybatch.npu_model``); arrives with the NPU issue."""
