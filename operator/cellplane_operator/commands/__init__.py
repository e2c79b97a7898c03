"""Every command line of cellplane in one place: ``cellplane`` (``main``) and its
subcommands, and ``kubectl cellplane`` (``kubectl``). Each module parses its arguments
and calls into the packages below; none of them decides anything itself."""
