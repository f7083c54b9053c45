"""The Triton Python-backend model that runs split stages under a `lazybatch.batcher` policy.

Installed as ``lazybatch.backend``. ``model.py`` is the ``TritonPythonModel`` (the only module that imports Triton's
``pb_utils``); ``runtime.py`` the scheduler thread; ``stages.py`` the onnxruntime sessions; ``config.py`` the
config.pbtxt parameters. See docs/triton.md and docs/architecture.md.
"""
