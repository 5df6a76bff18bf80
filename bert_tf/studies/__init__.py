"""Study harnesses: the emulated cluster, the communication study, the recipe race, the speed
ladder, op profiles, the spot-cluster run. Measurement apparatus for docs/results.md; the library
never imports it (tests/test_code_rules.py)."""
