"""What every folder of the package may use, importing none of them (and no torch): names that moved (deprecation.py,
moved_modules.py), the model names that stand for local folders (model_names.py), and the answer readers that workflows
and tasks share (parse_rules.py)."""
