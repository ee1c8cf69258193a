"""lancetx.commit: Lance storage artifacts, transactions, conflict resolution and the commit loop."""
