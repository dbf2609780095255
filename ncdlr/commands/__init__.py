"""One module per ``ncdlr`` subcommand (see ``ncdlr.cli``)."""
