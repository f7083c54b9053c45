"""One module per ``lazybatch`` subcommand; each exposes ``register(subparsers)``."""
