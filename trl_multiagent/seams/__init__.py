"""The seams: one module per upstream library, the only places the package goes below that library's public surface.

A module here reads or writes a private attribute of the library's objects, replaces one of their methods, or imports a
name the library does not export; each such use carries a comment saying what the library does there and since which
release. Nothing else in the package does (tests/package/test_seams.py reads every module with ``ast`` and lists the
offenders), so an upstream release that moves an internal breaks one named place. TRL's ``GRPOTrainer`` and the
Trainer, which the trainer subclasses, have theirs in ``trainer/grpo_seam.py`` (their private hooks and state, behind
public names); TRL's helpers are in ``seams/trl.py``.

A library's public surface, as the test reads it: the names its top-level package exports, plus the modules its
reference documents as such (``transformers.integrations``' callbacks; ``accelerate.utils``; ``deepspeed.zero`` and
``deepspeed.utils``). The seams import nothing of the package, so every folder of the package may use them.
"""
