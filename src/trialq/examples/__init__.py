"""Example trial entrypoints that ship with trialq (allowed on workers by default)."""
