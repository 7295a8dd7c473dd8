"""Hypothesis profiles of the fuzz suite.

``ci`` (the default) keeps every fuzz test to a bounded number of examples so
that the suite runs in CI in well under a minute; ``nightly`` runs many more.
Pick one with ``HYPOTHESIS_PROFILE=nightly`` (or pytest's
``--hypothesis-profile nightly``). The fuzz tests take their settings from
:data:`tests.unit.fuzz.profiles.FUZZ`, so a mixed run does not change the
example counts of the other property tests.
"""

from tests.unit.fuzz import profiles

assert profiles.FUZZ is not None
