"""Generation backends behind one small protocol (``base.GenerationBackend``)."""
