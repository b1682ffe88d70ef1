"""Read-only views of a study for people: `trialq status`, `trialq report` and the end-of-run
summary."""
