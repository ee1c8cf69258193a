"""``python -m lancetx.cli``."""

from lancetx.cli.app import main

main()
