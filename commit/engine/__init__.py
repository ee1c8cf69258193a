"""Operations, conflict rules, manifest building, rebase, retry policy and the commit loop."""
