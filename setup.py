"""Package layout only (metadata and dependencies are in setup.cfg).

recipes/ and accelerate_configs/ stay at the repository root, where `accelerate launch recipes/...` runs them from a
checkout; the wheel ships them as the packages trl_multiagent.recipes and trl_multiagent.accelerate_configs.
"""

from setuptools import find_packages, setup

SHIPPED = {"trl_multiagent.recipes": "recipes", "trl_multiagent.accelerate_configs": "accelerate_configs"}

setup(packages=find_packages(include=["trl_multiagent*"]) + list(SHIPPED), package_dir=SHIPPED)
