"""Role adapters: which adapter serves which role, per-sample routing, and how each adapter is updated.

The trainer talks to one object, ``AdapterUpdates`` (``updates.py``), at four points of a step; routing, the update
schedule, per-role gradient splits and coherence damping live behind it.
"""
