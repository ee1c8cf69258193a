"""How one version is claimed atomically: the CommitHandler interface and the conditional-PUT handler."""
