"""The batch domain: validation, the runner, output files."""
