"""The Triton Python-backend model that runs split stages under a `lazybatch.batcher` policy.

Installed as ``lazybatch.backend``. The backend itself arrives with the Triton-plugin issue; this package exists
now so that the namespace layout (see README, "Package layout") is fixed from the first release.
"""
