"""What a served model, its clients and the simulator all read (installed as ``lazybatch.formats``).

``dtypes``: Triton's datatype names as numpy dtypes (the config's ``TYPE_*`` and the wire's names); ``prometheus``:
series out of a Prometheus text scrape; ``histograms``: the length histograms the project ships, which seq2seq
requests are drawn from; ``stage_manifest``: a stage folder's ``manifest.json``, its schema and its one loader.
Numpy, the standard library and the core only, so that the backend, the offline tools, the client (no onnxruntime)
and the simulator (no Triton) can all import it without importing each other.
"""
