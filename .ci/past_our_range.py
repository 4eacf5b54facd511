"""usage: python .ci/past_our_range.py DIST...: for each distribution, its installed version and whether
trl-multiagent's declared range allows it; exits 1 when one is past that range (.ci/newest_upstream.sh tests only
then)."""

import importlib.metadata as metadata
import sys

from packaging.requirements import Requirement

asked = set(sys.argv[1:])
past = False
for line in metadata.requires("trl-multiagent"):
    requirement = Requirement(line)
    if requirement.name in asked and requirement.marker is None:  # not an extra's
        installed = metadata.version(requirement.name)
        within = requirement.specifier.contains(installed, prereleases=True)
        past |= not within
        verdict = "within" if within else "PAST"
        print(f"newest {requirement.name}: {installed}, {verdict} our range {requirement.specifier}")
sys.exit(1 if past else 0)
