"""The Triton Python-backend model that runs split stages under a `lazybatch.batcher` policy.

Installed as ``lazybatch.backend``. ``model.py`` is the ``TritonPythonModel`` (the only module that imports Triton's
``pb_utils``), ``model_kinds.py`` what each kind of model is served with; ``runtime.py`` the scheduler thread's
runtime (its inbox), composed of ``scheduler_loop.py`` (when its thread sleeps), ``runtime_hooks.py`` (bookkeeping
at idle moments), ``clock.py``, ``rows.py`` (requests split into samples and joined back), ``stage_runs.py`` and
``inline.py`` (passes run in ``execute``); ``stages.py`` the onnxruntime sessions; ``config.py``
the config.pbtxt parameters. See docs/triton.md and docs/architecture.md.
"""
