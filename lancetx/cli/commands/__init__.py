"""One module per ``lancetx-sync`` command group."""
