"""The command line, through click's CliRunner and as real subprocesses."""
