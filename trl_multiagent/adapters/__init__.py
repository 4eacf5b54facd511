"""Role adapters: which adapter serves which role, the base models they sit on, and how each adapter is updated.

``InstalledAdapters`` (installed.py) puts the adapters, their routers and shadows on the bases (bases.py); the
update is four parts built together (``AdapterUpdates``, updates.py), each called by the trainer by name: routing
(sample_routing.py), the optimizer (optimizer.py), process alignment (process_alignment.py) and gradient
accounts (gradient_accounts.py); ``AdapterSteps`` (clip_and_step.py) takes the optimizer steps of a training step
over them.
"""
