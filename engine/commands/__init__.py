"""One module per `ggstation` subcommand: add_parser(subparsers) and run(args) -> int."""
