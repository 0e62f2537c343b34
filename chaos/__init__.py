"""Chaos: inject real faults into a running monarch_ft job and measure recovery (MTTR)."""
